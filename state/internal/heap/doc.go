// Package heap is the heap engine of keyed state: the tables that
// state.NewKeyedBackend's states live in. Table serves value, list,
// reducing and aggregating states (engine.Table), MapTable map states
// (engine.MapTable). Package state picks them (its newTable and
// newMapTable) and its typed handles call them; users never import this
// package. It imports state/internal/engine and never state.
//
// A Table is a copy-on-write paged table. Its entries live in pages of
// PageSize (1024) slots, found through an open-addressing index of 4-byte
// slots (index.go: a Go map from key to slot holds every key twice, and
// index plus pages then no longer fit a core's cache at 10,000 keys). The
// table holds its pages by value (epoch and entries), so a lookup reads
// the page's entries straight from the page slice. A read or an update of
// an existing key is one index lookup: the table remembers the current
// key's slot while the backend's count of SetCurrentKey calls (the gen
// pointer NewTable takes) is unchanged. A MapTable is one Table of all its
// entries keyed by (key, user key), plus, beside the pages and never
// snapshotted, a doubly linked chain of each key's entries through their
// slots that per-key iteration, Count and Clear walk, so linking an entry
// copies no page.
//
// Freeze copies the page slice (one pointer per page), records the current
// epoch as held by the returned view and starts a new one; a later write
// to a page a live view may hold copies the page first, once per page and
// view. A table of values that may change in place (not
// engine.ImmutableType) is encoded at Freeze instead.
//
// Invariants (S numbers as in package state, whose doc states them in
// full):
//   - S7, S13: Get and Put of an existing key (and MapTable's of an
//     existing entry) do not allocate, also while a view is live, once the
//     key's page was copied.
//   - S8: Freeze holds no lock and costs O(pages) for an immutable table.
//   - S9: a frozen view is never written: every write to a page whose
//     epoch a live view holds goes to a copy, so the view's Encode reads
//     only memory nothing writes, on any goroutine. A replaced page array
//     is reused only once every view live when it was replaced is
//     released; at most one spare array per page is kept.
//   - S10: MapTable's per-entry operations touch only their entry; Count
//     is O(1).
//   - I1: every live entry's slot is in the index exactly once, reachable
//     from its key's home position without crossing an empty cell; nothing
//     else is in the index. I2: the index's load is at most 1/2
//     (TestIndexRandomOps checks both after every step).
//   - A view encodes its entries sorted by (key group, key, user key)
//     (S1), skipping those expired at the backend's time at Freeze (S12).
//
// The tables are owned by the backend's goroutine; only a view's Encode
// may run elsewhere. Their errors and panics carry the prefix "state:",
// as they reach users through package state's API.
package heap
