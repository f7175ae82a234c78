package bench

// PeerResult is one run of a pipeline in a peer engine (the Apache Beam
// module bench/beam prints one a line as JSON; the harness reads it).
type PeerResult struct {
	Engine   string  `json:"engine"`
	Runner   string  `json:"runner"`
	Pipeline string  `json:"pipeline"`
	Records  int64   `json:"records"`
	Seconds  float64 `json:"seconds"`
	RecPerS  float64 `json:"records_per_s"`
	Error    string  `json:"error,omitempty"`
}
