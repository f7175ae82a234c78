// Package nethook gives the tests of the graph runtime its per-edge
// channel factory for network channels (graph's netwire.go) without a
// public API: package graph sets Network when it is initialized. Only
// packages under graph/ can import it.
package nethook

import "github.com/snapflow/snapflow/channel/netchan"

// Network makes the channels of the edges of job (a *graph.Job) that
// selects chooses, by the uids of the operators they connect, network
// channels: the reader's end listens on srv, the writer's dials conn.
var Network func(job any, srv *netchan.Server, conn *netchan.Conn, selects func(from, to string) bool)
