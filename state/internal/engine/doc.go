// Package engine is what the keyed-state engines (package heap, package
// pebble) and the typed handles of package state share: the storage
// contract and the plumbing of the one snapshot encoding. It sits below
// all three; it imports neither.
//
//   - The table contract: Table (value, list, reducing and aggregating
//     states) and MapTable (map states), which the handles call with the
//     backend's current key and its key group, and Frozen, the view a
//     table's Freeze returns and KeyedSnapshot encodes (GroupCursor and
//     Streamer for the views that hand out a key group at a time). See
//     "Seam for the Pebble backend" in package state.
//   - Spec: how a table encodes its keys, user keys and values in a
//     snapshot, its descriptor entry, and with a TTL which values are
//     expired (Live, Prune).
//   - The value codecs (ValueCodec: MsgpackCodec, UserCodec around a
//     caller's Codec, RunCodec, TTLCodec, ListCodec), the reused Encoder
//     and Decoder, EncodeFast and DecodeFast, and Encoder.SortGroup, the
//     one ordering of a key group's entries (state S1).
//   - RestoredEntry: one decoded, checked restored entry (state S2) that
//     a table takes over at registration (state S3).
//
// Invariants (numbered as in package state, whose doc states them in
// full): an Encoder never writes a slice it handed out (later encodings
// append past it); DecodeInto and every ValueCodec's Decode never panic
// (S6: CheckValue bounds every declared length before the msgpack decoder
// runs, and a caller's codec's panic becomes an error); the bytes a codec
// writes are the snapshot format (S1) and never change.
package engine
