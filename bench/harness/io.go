package harness

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"time"

	"github.com/cockroachdb/pebble/v2/vfs"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/twmb/franz-go/pkg/kfake"

	"github.com/snapflow/snapflow/bench"
	"github.com/snapflow/snapflow/graph"
	"github.com/snapflow/snapflow/internal/testsupport/pgtest"
	"github.com/snapflow/snapflow/sink"
	"github.com/snapflow/snapflow/sink/postgres"
	"github.com/snapflow/snapflow/source"
)

// The sinks-and-sources scenario: the file sources, the file table, Kafka
// (kfake) and PostgreSQL, each against a plain loop doing the same I/O
// without the engine, with the visibility delay of the transactional
// sinks.

func runIO(ctx context.Context, r *runner, sc *Scenario) error {
	var vs variants
	dir, err := os.MkdirTemp(r.tmp, "io-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(dir)
	n := r.sz.io
	files := map[string]string{}
	for _, format := range []string{"ndjson", "json-array", "csv"} {
		files[format] = filepath.Join(dir, "signals."+format)
		if _, err := bench.WriteSignals(files[format], format, n); err != nil {
			return err
		}
	}
	files["csv-func"] = files["csv"]

	kc, err := bench.KafkaCluster("in")
	if err != nil {
		return fmt.Errorf("kfake: %w", err)
	}
	defer kc.Close()
	if err := bench.FillKafka(kc, "in", r.sz.kafka); err != nil {
		return fmt.Errorf("kfake: %w", err)
	}

	pg, pgErr := pgtest.StartServer()
	if pgErr != nil {
		sc.Notes = append(sc.Notes, "PostgreSQL not measured: "+pgErr.Error())
	} else {
		defer pg.Close()
	}
	var pool *pgxpool.Pool
	if pg != nil {
		if pool, err = pgxpool.New(ctx, pg.DSN()); err != nil {
			return fmt.Errorf("postgres: %w", err)
		}
		defer pool.Close()
	}

	for round := range r.cfg.Repeat {
		for _, format := range []string{"ndjson", "json-array", "csv", "csv-func"} {
			cs := "file source, " + format
			plain := sideOf(func() (int64, error) { return bench.PlainRead(files[format], trimFunc(format)) })
			engine := sideOf(func() (int64, error) { return bench.EngineRead(files[format], format) })
			if err := pairedRound(&vs, cs, n, bench.SignalsSum(n), plain, engine); err != nil {
				vs.get(cs, "engine").fail(round, "%v", err)
			}
		}

		cs := "file table sink"
		tdir := filepath.Join(dir, fmt.Sprintf("table-%d", round))
		if err := os.MkdirAll(tdir, 0o755); err != nil {
			return err
		}
		plain := sideOf(func() (int64, error) { return n, bench.PlainWrite(tdir, n) })
		engine := sideOf(func() (int64, error) {
			tbl, err := bench.EngineWrite(filepath.Join(tdir, "table"), n, 100*time.Millisecond, nil)
			if err != nil {
				return 0, err
			}
			s, _, err := tbl.Latest()
			return s.TotalRecords, err
		})
		if err := pairedRound(&vs, cs, n, n, plain, engine); err != nil {
			vs.get(cs, "engine").fail(round, "%v", err)
		} else if delays, err := bench.TableVisibility(filepath.Join(tdir, "vis"), min(n, 200_000), 100*time.Millisecond); err != nil {
			vs.get(cs, "engine").fail(round, "visibility: %v", err)
		} else {
			addDelays(vs.get(cs, "engine"), delays)
		}

		for _, eos := range []bool{true, false} {
			cs := "kafka (kfake) -> kafka, at-least-once"
			if eos {
				cs = "kafka (kfake) -> kafka, exactly-once"
			}
			if err := kafkaRound(ctx, &vs, kc, cs, round, r.sz.kafka, eos); err != nil {
				vs.get(cs, "engine").fail(round, "%v", err)
			}
		}

		if pool != nil {
			for _, m := range []string{"2pc copy", "2pc insert", "upsert"} {
				cs := "postgres sink, " + m
				if err := pgRound(ctx, &vs, pool, cs, m, r.sz.postgres); err != nil {
					vs.get(cs, "engine").fail(round, "%v", err)
				}
			}
		}
		r.logf("io: round %d done", round+1)
	}
	sc.Results = vs.results()
	sc.Notes = append(sc.Notes,
		"File sources: device signals decoded into a struct, one subtask, offsets checkpointed every 100 ms; the loop: bufio + "+
			"json.Unmarshal per line, a json.Decoder over the array, encoding/csv with the same hand-written decoder as csv-func (csv: "+
			"source.CSV decodes by the struct's tags).",
		"File table: sink.WriteAndCommit into sink/filetable, a snapshot committed per checkpoint (100 ms), fsync on; the loop "+
			"encodes the same signals into one file with json.Encoder and fsyncs it once. Visibility: from a record's emission until "+
			"a reader polling the table every millisecond sees it committed.",
		"Kafka: kfake, franz-go's in-process fake cluster (no network, disk or replication): the figures bound the engine's "+
			"overhead over a plain franz-go consume/produce loop (exactly-once: a transaction every 100 ms), not a real broker's "+
			"throughput. Visibility: records produced at about 50k/s until a read_committed consumer of the output sees them.",
		"PostgreSQL: a throwaway local server (internal/testsupport/pgtest); the exactly-once sink (prepared transactions, one per subtask "+
			"per 100 ms checkpoint; COPY or multi-row INSERT) and the at-least-once upsert sink (INSERT ... ON CONFLICT, batches of "+
			"500) against a plain pgx loop on one connection writing the same rows in one transaction (COPY, or INSERTs of 4096 rows).")
	return nil
}

// trimFunc is the file format of a reading format ("csv-func" reads csv).
func trimFunc(format string) string {
	if format == "csv-func" {
		return "csv"
	}
	return format
}

// side is one side of a paired measurement: setup runs before it, run is
// timed, got says afterwards what it delivered (neither of those timed).
type side struct {
	setup func() error
	run   func() error
	got   func() (int64, error)
}

func (sd side) measure() (sample, int64, error) {
	if sd.setup != nil {
		if err := sd.setup(); err != nil {
			return sample{}, 0, err
		}
	}
	s, err := measure(sd.run)
	if err != nil {
		return s, 0, err
	}
	got, err := sd.got()
	return s, got, err
}

// pairedRound measures plain then engine over n records, checks what each
// delivered against want, and adds their rates and the ratio.
func pairedRound(vs *variants, cs string, n, want int64, plain, engine side) error {
	base, got, err := plain.measure()
	if err != nil {
		return fmt.Errorf("loop: %w", err)
	}
	if got != want {
		return fmt.Errorf("loop: got %d, want %d", got, want)
	}
	eng, got, err := engine.measure()
	if err != nil {
		return fmt.Errorf("engine: %w", err)
	}
	if got != want {
		return fmt.Errorf("engine: got %d, want %d", got, want)
	}
	vs.get(cs, "plain loop").addRate(n, base)
	e := vs.get(cs, "engine")
	e.addRate(n, eng)
	e.addRatio(base.dur.Seconds()/eng.dur.Seconds(), "engine / plain loop records/s")
	return nil
}

// sideOf is the side whose run computes its result, f: got returns what
// the last run computed.
func sideOf(f func() (int64, error)) side {
	var n int64
	return side{
		run: func() (err error) { n, err = f(); return err },
		got: func() (int64, error) { return n, nil },
	}
}

// addDelays adds the p50, p99 and max of sorted delays (ms) as figures.
func addDelays(v *variant, delays []float64) {
	v.addFigure("visible p50 ms", delays[len(delays)/2])
	v.addFigure("visible p99 ms", delays[len(delays)*99/100])
	v.addFigure("visible max ms", delays[len(delays)-1])
}

func kafkaRound(ctx context.Context, vs *variants, c *kfake.Cluster, cs string, round int, n int64, eos bool) error {
	brokers := c.ListenAddrs()
	suffix := fmt.Sprintf("%d-%t", round, eos)
	loopOut, engOut := "loop-"+suffix, "engine-"+suffix
	for _, t := range []string{loopOut, engOut} {
		if err := bench.CreateKafkaTopic(c, t); err != nil {
			return err
		}
	}
	count := func(topic string) func() (int64, error) {
		return func() (int64, error) { return bench.CountCommitted(brokers, topic) }
	}
	plain := side{run: func() error { return bench.PlainKafkaLoop(brokers, "in", loopOut, loopOut, n, eos) }, got: count(loopOut)}
	engine := side{run: func() error { return bench.EngineKafka(ctx, brokers, "in", engOut, engOut, 1, eos, true) }, got: count(engOut)}
	if err := pairedRound(vs, cs, n, n, plain, engine); err != nil {
		return err
	}
	delays, err := bench.KafkaVisibility(c, eos, min(n, 50_000))
	if err != nil {
		return fmt.Errorf("visibility: %w", err)
	}
	addDelays(vs.get(cs, "engine"), delays)
	return nil
}

// pgRow is the record of the PostgreSQL sinks.
type pgRow struct{ ID int64 }

func pgValues(r pgRow) []any { return []any{r.ID, "payload"} }

// pgRound writes n rows through the sink of mode m (fresh table) and
// through the plain loop of the same kind, and counts what each wrote.
func pgRound(ctx context.Context, vs *variants, pool *pgxpool.Pool, cs, m string, n int64) error {
	reset := func() error {
		_, err := pool.Exec(ctx, `DROP TABLE IF EXISTS bench; CREATE TABLE bench (id bigint PRIMARY KEY, payload text)`)
		return err
	}
	count := func() (int64, error) {
		var c int64
		err := pool.QueryRow(ctx, `SELECT count(*) FROM bench`).Scan(&c)
		return c, err
	}
	plain := side{setup: reset, run: func() error { return plainPg(ctx, pool, n, m == "2pc copy") }, got: count}
	engine := side{setup: reset, got: count, run: func() error {
		j := graph.NewJob("bench-pg", graph.Config{
			Checkpoint: graph.CheckpointConfig{Interval: 100 * time.Millisecond, Dir: "/ckpt", FS: vfs.NewMem()},
			Logf:       quiet,
		})
		src := graph.Source(j, "src", source.Generate(n, func(i int64) pgRow { return pgRow{ID: i} }))
		switch m {
		case "upsert":
			u, err := postgres.NewUpsert(ctx, pool, postgres.UpsertConfig[pgRow]{Table: "bench", Columns: []string{"id", "payload"},
				Key: []string{"id"}, Row: pgValues})
			if err != nil {
				return err
			}
			graph.Sink(src, "out", u.Sink())
		default:
			mode := postgres.Copy
			if m == "2pc insert" {
				mode = postgres.Insert
			}
			s, err := postgres.New(ctx, pool, postgres.Config[pgRow]{Table: "bench", Columns: []string{"id", "payload"}, Row: pgValues, Mode: mode})
			if err != nil {
				return err
			}
			graph.Sink(src, "out", s.SinkFunc(sink.WithLogf(quiet)))
		}
		return j.Run(ctx)
	}}
	return pairedRound(vs, cs, n, n, plain, engine)
}

// plainPg writes n rows on one connection in one transaction: CopyFrom,
// or INSERTs of 4096 rows.
func plainPg(ctx context.Context, pool *pgxpool.Pool, n int64, copyRows bool) error {
	tx, err := pool.Begin(ctx)
	if err != nil {
		return err
	}
	defer tx.Rollback(ctx)
	if copyRows {
		rows := make([][]any, 0, n)
		for i := range n {
			rows = append(rows, pgValues(pgRow{ID: i}))
		}
		if _, err := tx.CopyFrom(ctx, pgx.Identifier{"bench"}, []string{"id", "payload"}, pgx.CopyFromRows(rows)); err != nil {
			return err
		}
		return tx.Commit(ctx)
	}
	const batch = 4096
	for lo := int64(0); lo < n; lo += batch {
		hi := min(lo+batch, n)
		q := []byte("INSERT INTO bench (id, payload) VALUES ")
		args := make([]any, 0, 2*(hi-lo))
		for i := lo; i < hi; i++ {
			if i > lo {
				q = append(q, ',')
			}
			q = fmt.Appendf(q, "($%d, $%d)", len(args)+1, len(args)+2)
			args = append(args, pgValues(pgRow{ID: i})...)
		}
		if _, err := tx.Exec(ctx, string(q), args...); err != nil {
			return err
		}
	}
	return tx.Commit(ctx)
}
