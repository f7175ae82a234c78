package main

import (
	"fmt"
	"io"
	"os"
	"strconv"
	"text/tabwriter"

	"github.com/spf13/cobra"

	"github.com/snapflow/snapflow/snapshot/inspect"
	"github.com/snapflow/snapflow/state/keygroup"
)

const inspectLong = `inspect reads the state in a checkpoint or savepoint, read-only, without
a running job (snapflow's state reader, like Flink's State Processor API).
PATH is a chk-N or savepoint-N directory or its _metadata file.

Without --operator it lists every operator: uid, parallelism, max
parallelism, each subtask's key-group range and state bytes, its keyed
states (layout, entries, bytes, key groups) and its operator list states
(for a source: its positions). With --operator it also prints that
operator's list state elements, and with --state the entries of one keyed
state (decoded without the job's types; at most --limit of them). --key
shows only the entries of that key (compared as printed) and the key group
and subtask that own it, so you can watch a key move between subtasks
when a job is restored at another parallelism.`

const inspectExample = `  snapdemo inspect snapdemo-replay/sensors/checkpoints/<job-id>/chk-7
  snapdemo inspect savepoint-12 --operator device-state --state last --key dev-3
  snapdemo inspect chk-7 --json`

type inspectReport struct {
	Path       string             `json:"path"`
	Checkpoint int64              `json:"checkpoint"`
	Savepoint  bool               `json:"savepoint"`
	Operators  []inspect.Operator `json:"operators"`
	Lists      []listItem         `json:"list_items,omitempty"`
	Entries    []entryOut         `json:"entries,omitempty"`
	Key        *keyOwner          `json:"key,omitempty"`
}

type listItem struct {
	State   string `json:"state"`
	Subtask int    `json:"subtask"`
	Value   any    `json:"value"`
}

type entryOut struct {
	KeyGroup int    `json:"key_group"`
	Key      any    `json:"key"`
	UserKey  any    `json:"user_key,omitempty"`
	Value    any    `json:"value"`
	Stamp    string `json:"ttl_stamp,omitempty"`
}

type keyOwner struct {
	Key      string `json:"key"`
	KeyGroup int    `json:"key_group"`
	Subtask  int    `json:"subtask"`
	// As says how the key was hashed: as a string, or as an int64 when it
	// parses as one and its entries are in that key group.
	As string `json:"hashed_as"`
}

func newInspectCmd(g *globalFlags, stdout io.Writer) *cobra.Command {
	var (
		asJSON        bool
		op, name, key string
		limit         int
	)
	cmd := &cobra.Command{
		Use:     "inspect PATH",
		Short:   "Read the state in a checkpoint or savepoint: operators, key groups, states, one key",
		Long:    inspectLong,
		Example: inspectExample,
		Args: func(cmd *cobra.Command, args []string) error {
			if len(args) != 1 {
				return usagef("inspect takes one checkpoint or savepoint path, got %d arguments", len(args))
			}
			return nil
		},
		RunE: func(cmd *cobra.Command, args []string) error {
			if name != "" && op == "" {
				return usagef("--state needs --operator")
			}
			if key != "" && name == "" {
				return usagef("--key needs --operator and --state")
			}
			if _, err := os.Stat(args[0]); err != nil {
				return usagef("%s: %v", args[0], plainErr(err))
			}
			c, err := inspect.Open(nil, args[0])
			if err != nil {
				return fmt.Errorf("%s: %v", args[0], err)
			}
			rep := inspectReport{Path: c.Dir(), Checkpoint: c.ID(), Savepoint: c.Savepoint()}
			if op == "" {
				if rep.Operators, err = c.Operators(); err != nil {
					return err
				}
			} else {
				o, err := c.Operator(op)
				if err != nil {
					return usagef("%v", err)
				}
				rep.Operators = []inspect.Operator{o}
				for _, l := range o.Lists {
					items, err := inspect.RawOperatorList(c, op, l.Name)
					if err != nil {
						return err
					}
					for _, it := range items {
						rep.Lists = append(rep.Lists, listItem{State: l.Name, Subtask: it.Subtask, Value: jsonable(it.Value)})
					}
				}
			}
			if name != "" {
				es, err := inspect.RawEntries(c, op, name)
				if err != nil {
					return usagef("%v", err)
				}
				o := rep.Operators[0]
				if key != "" {
					rep.Key = ownerOf(key, o, es)
				}
				for _, e := range es {
					if key != "" && fmt.Sprint(e.Key) != key {
						continue
					}
					if len(rep.Entries) == limit {
						break
					}
					out := entryOut{KeyGroup: e.KeyGroup, Key: jsonable(e.Key), UserKey: jsonable(e.UserKey), Value: jsonable(e.Value)}
					if !e.Stamp.IsZero() {
						out.Stamp = e.Stamp.UTC().Format("2006-01-02T15:04:05.000Z07:00")
					}
					rep.Entries = append(rep.Entries, out)
				}
			}
			if asJSON {
				printJSON(stdout, rep)
				return nil
			}
			printInspect(stdout, rep, name, key)
			return nil
		},
	}
	cmd.Flags().BoolVar(&asJSON, "json", false, "print the report as JSON")
	cmd.Flags().StringVar(&op, "operator", "", "the uid of one operator to show in full")
	cmd.Flags().StringVar(&name, "state", "", "a keyed state of --operator whose entries to print")
	cmd.Flags().StringVar(&key, "key", "", "print only the entries of this key (as printed), and the key group and subtask that own it")
	cmd.Flags().IntVar(&limit, "limit", 20, "print at most this many entries")
	return cmd
}

// ownerOf computes the key group and owning subtask of key: hashed as a
// string, or as an int64 when it parses as one and the entries found under
// it lie in that key group.
func ownerOf(key string, o inspect.Operator, es []inspect.RawEntry) *keyOwner {
	maxP := o.MaxParallelism
	k := &keyOwner{Key: key, KeyGroup: keygroup.Of(key, maxP), As: "string"}
	if n, err := strconv.ParseInt(key, 10, 64); err == nil {
		kg := keygroup.Of(n, maxP)
		for _, e := range es {
			if fmt.Sprint(e.Key) == key && e.KeyGroup == kg {
				k.KeyGroup, k.As = kg, "int64"
				break
			}
		}
	}
	k.Subtask = keygroup.Owner(maxP, o.Parallelism, k.KeyGroup)
	return k
}

// jsonable turns the maps msgpack decodes (map[any]any for non-string
// keys) into values encoding/json can print.
func jsonable(v any) any {
	switch x := v.(type) {
	case map[any]any:
		m := make(map[string]any, len(x))
		for k, e := range x {
			m[fmt.Sprint(k)] = jsonable(e)
		}
		return m
	case map[string]any:
		for k, e := range x {
			x[k] = jsonable(e)
		}
		return x
	case []any:
		for i, e := range x {
			x[i] = jsonable(e)
		}
		return x
	}
	return v
}

func printInspect(w io.Writer, r inspectReport, name, key string) {
	kind := "checkpoint"
	if r.Savepoint {
		kind = "savepoint"
	}
	fmt.Fprintf(w, "%s %d at %s\n", kind, r.Checkpoint, r.Path)
	for _, o := range r.Operators {
		fmt.Fprintf(w, "\noperator %s (%s): parallelism %d, max parallelism %d\n", o.UID, o.Name, o.Parallelism, o.MaxParallelism)
		tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
		fmt.Fprintln(tw, "  subtask\tkey groups\tstate bytes\tin flight")
		for _, s := range o.Subtasks {
			kg := "-"
			if s.KeyGroups.Start >= 0 {
				kg = s.KeyGroups.String()
			}
			fmt.Fprintf(tw, "  %d\t%s\t%d\t%d\n", s.Index, kg, s.StateBytes, s.InFlightInput+s.InFlightOutput)
		}
		_ = tw.Flush()
		if len(o.Keyed) > 0 {
			tw = tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
			fmt.Fprintln(tw, "  keyed state\tlayout\tentries\tbytes\tkey groups")
			for _, k := range o.Keyed {
				fmt.Fprintf(tw, "  %s\t%v\t%d\t%d\t%d\n", k.Name, k.Layout, k.Entries, k.Bytes, k.KeyGroups)
			}
			_ = tw.Flush()
		}
		if len(o.Lists) > 0 {
			tw = tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
			fmt.Fprintln(tw, "  list state\tdistribution\telements\tbytes")
			for _, l := range o.Lists {
				fmt.Fprintf(tw, "  %s\t%v\t%d\t%d\n", l.Name, l.Distribution, l.Items, l.Bytes)
			}
			_ = tw.Flush()
		}
	}
	for _, it := range r.Lists {
		fmt.Fprintf(w, "  %s[subtask %d]: %v\n", it.State, it.Subtask, it.Value)
	}
	if r.Key != nil {
		fmt.Fprintf(w, "\nkey %q (hashed as %s) is in key group %d, owned by subtask %d\n", r.Key.Key, r.Key.As, r.Key.KeyGroup, r.Key.Subtask)
	}
	if name != "" {
		fmt.Fprintf(w, "\nentries of %s", name)
		if key != "" {
			fmt.Fprintf(w, " for key %q", key)
		}
		fmt.Fprintf(w, " (%d shown):\n", len(r.Entries))
		for _, e := range r.Entries {
			fmt.Fprintf(w, "  kg %d  key %v", e.KeyGroup, e.Key)
			if e.UserKey != nil {
				fmt.Fprintf(w, "  user key %v", e.UserKey)
			}
			fmt.Fprintf(w, "  = %v", e.Value)
			if e.Stamp != "" {
				fmt.Fprintf(w, "  (written %s)", e.Stamp)
			}
			fmt.Fprintln(w)
		}
	}
}
