// Package netchan is the network channel layer: logical channels between
// subtasks of different worker processes, on gRPC streams, with barriers and
// the other in-band events in order with the data, credit-based flow
// control per channel, and unaligned barriers that overtake queued buffers
// on both sides.
package netchan
