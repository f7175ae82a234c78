package main

import (
	"slices"
	"strconv"
	"unicode/utf8"
)

// fastObject parses the common shapes of input records, a flat JSON
// object of strings without escapes, numbers, booleans and nulls, or the
// seed's {"D1": {flat object}}, into the fields parseJSONObject would make,
// without encoding/json's reflection. It reports false for anything else
// (escapes, arrays, nested objects, invalid JSON, duplicate names): the
// caller then takes the encoding/json path, which also words the errors.
func fastObject(b []byte) (*fields, bool) {
	p := fastParser{b: b}
	p.ws()
	if p.i >= len(b) || b[p.i] != '{' {
		return nil, false
	}
	// The seed's shape: {"D1": {...}}.
	p.i++
	p.ws()
	if name, ok := p.str(); ok {
		p.ws()
		if p.i < len(b) && b[p.i] == ':' {
			p.i++
			p.ws()
			if p.i < len(b) && b[p.i] == '{' {
				f := &fields{names: []string{"device"}, vals: []value{{s: name}}}
				if !p.flat(f) {
					return nil, false
				}
				p.ws()
				if p.i >= len(b) || b[p.i] != '}' {
					return nil, false
				}
				p.i++
				p.ws()
				if p.i != len(b) {
					return nil, false
				}
				sortFields(f, 1)
				return f, true
			}
		}
	}
	p.i = 0
	p.ws()
	f := &fields{}
	if !p.flat(f) {
		return nil, false
	}
	p.ws()
	if p.i != len(b) {
		return nil, false
	}
	sortFields(f, 0)
	return f, true
}

type fastParser struct {
	b []byte
	i int
}

func (p *fastParser) ws() {
	for p.i < len(p.b) {
		switch p.b[p.i] {
		case ' ', '\t', '\n', '\r':
			p.i++
		default:
			return
		}
	}
}

func (p *fastParser) str() (string, bool) {
	if p.i >= len(p.b) || p.b[p.i] != '"' {
		return "", false
	}
	start := p.i + 1
	for j := start; j < len(p.b); j++ {
		c := p.b[j]
		switch {
		case c == '"':
			s := p.b[start:j]
			if !utf8.Valid(s) {
				return "", false
			}
			p.i = j + 1
			return string(s), true
		case c == '\\' || c < 0x20:
			return "", false
		}
	}
	return "", false
}

// number scans a JSON number (RFC 8259 grammar).
func (p *fastParser) number() (string, float64, bool) {
	start, j := p.i, p.i
	b := p.b
	if j < len(b) && b[j] == '-' {
		j++
	}
	switch {
	case j < len(b) && b[j] == '0':
		j++
	case j < len(b) && b[j] >= '1' && b[j] <= '9':
		for j < len(b) && b[j] >= '0' && b[j] <= '9' {
			j++
		}
	default:
		return "", 0, false
	}
	if j < len(b) && b[j] == '.' {
		j++
		k := j
		for j < len(b) && b[j] >= '0' && b[j] <= '9' {
			j++
		}
		if j == k {
			return "", 0, false
		}
	}
	if j < len(b) && (b[j] == 'e' || b[j] == 'E') {
		j++
		if j < len(b) && (b[j] == '+' || b[j] == '-') {
			j++
		}
		k := j
		for j < len(b) && b[j] >= '0' && b[j] <= '9' {
			j++
		}
		if j == k {
			return "", 0, false
		}
	}
	s := string(b[start:j])
	n, err := strconv.ParseFloat(s, 64)
	p.i = j
	return s, n, err == nil
}

func (p *fastParser) lit(s string) bool {
	if len(p.b)-p.i >= len(s) && string(p.b[p.i:p.i+len(s)]) == s {
		p.i += len(s)
		return true
	}
	return false
}

// flat parses an object of scalars into f.
func (p *fastParser) flat(f *fields) bool {
	if p.i >= len(p.b) || p.b[p.i] != '{' {
		return false
	}
	p.i++
	first := len(f.names)
	p.ws()
	if p.i < len(p.b) && p.b[p.i] == '}' {
		p.i++
		return true
	}
	for {
		p.ws()
		name, ok := p.str()
		if !ok || slices.Contains(f.names[first:], name) {
			return false
		}
		p.ws()
		if p.i >= len(p.b) || p.b[p.i] != ':' {
			return false
		}
		p.i++
		p.ws()
		if p.i >= len(p.b) {
			return false
		}
		switch c := p.b[p.i]; {
		case c == '"':
			s, ok := p.str()
			if !ok {
				return false
			}
			f.names = append(f.names, name)
			f.vals = append(f.vals, value{s: s})
		case c == 't' || c == 'f':
			v := "true"
			if c == 'f' {
				v = "false"
			}
			if !p.lit(v) {
				return false
			}
			f.names = append(f.names, name)
			f.vals = append(f.vals, value{s: v})
		case c == 'n':
			if !p.lit("null") {
				return false
			}
		case c == '-' || (c >= '0' && c <= '9'):
			s, n, ok := p.number()
			if !ok {
				return false
			}
			f.names = append(f.names, name)
			f.vals = append(f.vals, value{s: s, n: n, num: true})
		default:
			return false // objects, arrays, invalid values
		}
		p.ws()
		if p.i >= len(p.b) {
			return false
		}
		switch p.b[p.i] {
		case ',':
			p.i++
		case '}':
			p.i++
			return true
		default:
			return false
		}
	}
}

// sortFields sorts f's fields from index first on by name.
func sortFields(f *fields, first int) {
	idx := make([]int, len(f.names)-first)
	for i := range idx {
		idx[i] = first + i
	}
	slices.SortStableFunc(idx, func(a, b int) int {
		switch {
		case f.names[a] < f.names[b]:
			return -1
		case f.names[a] > f.names[b]:
			return 1
		}
		return 0
	})
	names := make([]string, len(idx))
	vals := make([]value, len(idx))
	for i, j := range idx {
		names[i], vals[i] = f.names[j], f.vals[j]
	}
	copy(f.names[first:], names)
	copy(f.vals[first:], vals)
}
