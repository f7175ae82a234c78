package main

import (
	"fmt"
	"time"
)

// verify checks that every mote-minute of the readings is in the table
// once, with as many readings as it has: every reading is counted once.
func verify(readings []reading, table []minute) error {
	type key struct{ mote, start int64 }
	want := map[key]int64{}
	for _, r := range readings {
		want[key{r.Mote, r.time() - r.time()%int64(time.Minute)}]++
	}
	for _, m := range table {
		k := key{m.Mote, m.Start.UnixNano()}
		if want[k] != m.Readings {
			return fmt.Errorf("mote %d at %s: %d readings in the table, want one row of %d", m.Mote, m.Start, m.Readings, want[k])
		}
		delete(want, k) // a second row fails above
	}
	if len(want) > 0 {
		return fmt.Errorf("%d mote-minutes missing from the table", len(want))
	}
	return nil
}
