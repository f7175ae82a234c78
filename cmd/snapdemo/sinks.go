package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/url"
	"os"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/snapflow/snapflow/graph"
	"github.com/snapflow/snapflow/sink"
	"github.com/snapflow/snapflow/sink/filetable"
	"github.com/snapflow/snapflow/sink/kafka"
	"github.com/snapflow/snapflow/sink/postgres"
)

// ReplayRow is what replay commits: the record's identity and key, what
// the per-key state said when the record was processed (its sequence
// number in the key and the change of each numeric field), and which run
// (execution) and attempt processed it.
type ReplayRow struct {
	ID      string             `json:"id" msgpack:"id"`
	Key     string             `json:"key" msgpack:"key"`
	Seq     int64              `json:"seq" msgpack:"seq"`
	Deltas  map[string]float64 `json:"deltas,omitempty" msgpack:"d,omitempty"`
	Run     string             `json:"run" msgpack:"run"`
	Attempt int                `json:"attempt" msgpack:"att"`
}

// output is a replay's sink: where rows are committed and how the verdict
// reads them back.
type output interface {
	String() string
	// attach adds the sink to the job.
	attach(rows *graph.Stream[ReplayRow], cfg sinkConfig) error
	// committed reports whether the sink holds committed rows.
	committed(ctx context.Context) (bool, error)
	// reset deletes the committed rows (--fresh).
	reset(ctx context.Context) error
	// scan calls fn with every committed row.
	scan(ctx context.Context, fn func(r ReplayRow) error) error
	close()
}

// orphanRemover is an output that can delete what no commit references
// (files of failed attempts and of checkpoints that never completed), once
// the job writing it has finished for good.
type orphanRemover interface {
	removeOrphans() ([]string, error)
}

type sinkConfig struct {
	ctx      context.Context
	jobID    string
	interval time.Duration
	logf     func(format string, args ...any)
	// commitUser, if set, is the sinks' commit user (sink.WithCommitUser):
	// --allow-fallback republishes under a new one what the user committed
	// after the checkpoint restored, which the sink refuses otherwise.
	commitUser string
}

// options are the sinks' options.
func (c sinkConfig) options() []sink.Option {
	opts := []sink.Option{sink.WithLogf(c.logf)}
	if c.commitUser != "" {
		opts = append(opts, sink.WithCommitUser(c.commitUser))
	}
	return opts
}

// openOutput resolves --sink: a file table directory, a postgres:// URL or
// kafka://host:port/topic.
func openOutput(ctx context.Context, spec, pgTable string) (output, error) {
	switch {
	case strings.HasPrefix(spec, "postgres://"), strings.HasPrefix(spec, "postgresql://"):
		if _, err := pgx.ParseConfig(spec); err != nil {
			return nil, usagef("invalid --sink %s: %v", redact(spec), err)
		}
		return &pgOutput{dsn: spec, table: pgTable}, nil
	case strings.HasPrefix(spec, "kafka://"):
		u, err := url.Parse(spec)
		if err != nil || u.Host == "" || strings.Trim(u.Path, "/") == "" || strings.Contains(strings.Trim(u.Path, "/"), "/") {
			return nil, usagef("invalid --sink %s: want kafka://host:port/topic", spec)
		}
		return &kafkaOutput{brokers: strings.Split(u.Host, ","), topic: strings.Trim(u.Path, "/")}, nil
	case strings.Contains(spec, "://"):
		return nil, usagef("invalid --sink %s: want a directory, postgres://... or kafka://host:port/topic", spec)
	}
	if fi, err := os.Stat(spec); err == nil && !fi.IsDir() {
		return nil, usagef("--sink %s is a file; give a directory for the file table", spec)
	}
	tbl, err := filetable.Open(spec)
	if err != nil {
		return nil, fmt.Errorf("opening the file table %s: %w", spec, err)
	}
	return &tableOutput{tbl: tbl}, nil
}

// redact hides the password of a URL.
func redact(s string) string {
	u, err := url.Parse(s)
	if err != nil {
		return "(unparsable URL)"
	}
	return u.Redacted()
}

// ---- the file table ----

type tableOutput struct{ tbl *filetable.Table }

func (t *tableOutput) String() string { return "file table " + t.tbl.Dir() }

func (t *tableOutput) attach(rows *graph.Stream[ReplayRow], cfg sinkConfig) error {
	sink.WriteAndCommitWith(rows, "table", filetable.NewWriter[ReplayRow](t.tbl), t.tbl, sink.Retry{},
		cfg.options(), graph.Name("file table writer"))
	return nil
}

// removeOrphans deletes every file of the table that no snapshot
// references: the replay's job has finished, so none of them is waiting
// for a commit any more (filetable.RemoveOrphans, with no age).
func (t *tableOutput) removeOrphans() ([]string, error) { return t.tbl.RemoveOrphans(0) }

func (t *tableOutput) committed(context.Context) (bool, error) {
	s, ok, err := t.tbl.Latest()
	return ok && s.TotalRecords > 0, err
}

func (t *tableOutput) reset(context.Context) error {
	dir := t.tbl.Dir()
	if err := os.RemoveAll(dir); err != nil {
		return err
	}
	tbl, err := filetable.Open(dir)
	t.tbl = tbl
	return err
}

// rowIdentity is the part of a ReplayRow the verdict reads (decoding the
// deltas too would double the time of the read-back).
type rowIdentity struct {
	ID      string `json:"id"`
	Run     string `json:"run"`
	Attempt int    `json:"attempt"`
}

func (t *tableOutput) scan(_ context.Context, fn func(ReplayRow) error) error {
	return filetable.Scan(t.tbl, 0, func(r rowIdentity) error {
		return fn(ReplayRow{ID: r.ID, Run: r.Run, Attempt: r.Attempt})
	})
}

func (t *tableOutput) close() {}

// ---- PostgreSQL ----

type pgOutput struct {
	dsn, table string
	pg         *postgres.Sink[ReplayRow]
}

func (p *pgOutput) String() string { return "PostgreSQL table " + p.table + " at " + redact(p.dsn) }

func (p *pgOutput) ensureTable(ctx context.Context, conn *pgx.Conn) error {
	// No primary key: a duplicate commit shows as a duplicate row.
	_, err := conn.Exec(ctx, "CREATE TABLE IF NOT EXISTS "+pgx.Identifier(strings.Split(p.table, ".")).Sanitize()+
		" (id text NOT NULL, key text NOT NULL, seq bigint NOT NULL, run text NOT NULL, attempt int NOT NULL)")
	return err
}

func (p *pgOutput) conn(ctx context.Context) (*pgx.Conn, error) {
	conn, err := pgx.Connect(ctx, p.dsn)
	if err != nil {
		return nil, fmt.Errorf("PostgreSQL %s: %w", redact(p.dsn), err)
	}
	if err := p.ensureTable(ctx, conn); err != nil {
		conn.Close(ctx)
		return nil, fmt.Errorf("PostgreSQL %s: creating table %s: %w", redact(p.dsn), p.table, err)
	}
	return conn, nil
}

func (p *pgOutput) attach(rows *graph.Stream[ReplayRow], cfg sinkConfig) error {
	conn, err := p.conn(cfg.ctx)
	if err != nil {
		return err
	}
	conn.Close(cfg.ctx)
	pg, err := postgres.Open(cfg.ctx, p.dsn, postgres.Config[ReplayRow]{
		Table: p.table, Columns: []string{"id", "key", "seq", "run", "attempt"},
		Row: func(r ReplayRow) []any { return []any{r.ID, r.Key, r.Seq, r.Run, r.Attempt} },
	})
	if err != nil {
		return err
	}
	p.pg = pg
	graph.Sink(rows, "postgres", pg.SinkFunc(cfg.options()...), graph.Name("PostgreSQL sink"))
	return nil
}

func (p *pgOutput) committed(ctx context.Context) (bool, error) {
	conn, err := p.conn(ctx)
	if err != nil {
		return false, err
	}
	defer conn.Close(ctx)
	var n int64
	err = conn.QueryRow(ctx, "SELECT count(*) FROM "+pgx.Identifier(strings.Split(p.table, ".")).Sanitize()).Scan(&n)
	return n > 0, err
}

func (p *pgOutput) reset(ctx context.Context) error {
	conn, err := p.conn(ctx)
	if err != nil {
		return err
	}
	defer conn.Close(ctx)
	_, err = conn.Exec(ctx, "TRUNCATE "+pgx.Identifier(strings.Split(p.table, ".")).Sanitize())
	return err
}

func (p *pgOutput) scan(ctx context.Context, fn func(ReplayRow) error) error {
	conn, err := p.conn(ctx)
	if err != nil {
		return err
	}
	defer conn.Close(ctx)
	rows, err := conn.Query(ctx, "SELECT id, key, seq, run, attempt FROM "+pgx.Identifier(strings.Split(p.table, ".")).Sanitize())
	if err != nil {
		return err
	}
	defer rows.Close()
	for rows.Next() {
		var r ReplayRow
		if err := rows.Scan(&r.ID, &r.Key, &r.Seq, &r.Run, &r.Attempt); err != nil {
			return err
		}
		if err := fn(r); err != nil {
			return err
		}
	}
	return rows.Err()
}

func (p *pgOutput) close() {
	if p.pg != nil {
		p.pg.Close()
	}
}

// ---- Kafka ----

type kafkaOutput struct {
	brokers []string
	topic   string
	c       *kafka.Committer[ReplayRow]
}

func (k *kafkaOutput) String() string {
	return "Kafka topic " + k.topic + " at " + strings.Join(k.brokers, ",")
}

func (k *kafkaOutput) attach(rows *graph.Stream[ReplayRow], cfg sinkConfig) error {
	c, err := kafka.New(kafka.Config[ReplayRow]{
		Brokers: k.brokers, Topic: k.topic, CheckpointInterval: cfg.interval,
		TransactionTimeout:    5 * time.Minute,
		TransactionalIDPrefix: "snapdemo-" + cfg.jobID,
		Serializer: func(r ReplayRow) (*kgo.Record, error) {
			b, err := json.Marshal(r)
			return &kgo.Record{Key: []byte(r.Key), Value: b}, err
		},
		Logf: cfg.logf,
	})
	if err != nil {
		return err
	}
	k.c = c
	graph.Sink(rows, "kafka", sink.TwoPhaseCommit[ReplayRow, *kafka.Txn](c, cfg.options()...), graph.Name("Kafka sink"))
	return nil
}

func (k *kafkaOutput) admin() (*kgo.Client, *kadm.Client, error) {
	cl, err := kgo.NewClient(kgo.SeedBrokers(k.brokers...))
	if err != nil {
		return nil, nil, err
	}
	return cl, kadm.NewClient(cl), nil
}

// ends returns the last stable offsets of the topic's partitions (what a
// read_committed consumer reads up to); none if the topic does not exist.
func (k *kafkaOutput) ends(ctx context.Context) (map[int32]int64, error) {
	cl, adm, err := k.admin()
	if err != nil {
		return nil, err
	}
	defer cl.Close()
	offs, err := adm.ListCommittedOffsets(ctx, k.topic)
	if err != nil && strings.Contains(err.Error(), "UNKNOWN_TOPIC") {
		return map[int32]int64{}, nil // no topic yet: nothing committed
	}
	if err != nil {
		return nil, fmt.Errorf("Kafka %s: listing the offsets of %s: %w", strings.Join(k.brokers, ","), k.topic, err)
	}
	out := map[int32]int64{}
	offs.Each(func(o kadm.ListedOffset) {
		if o.Err == nil {
			out[o.Partition] = o.Offset
		}
	})
	return out, nil
}

func (k *kafkaOutput) committed(ctx context.Context) (bool, error) {
	n := 0
	err := k.scan(ctx, func(ReplayRow) error { n++; return errStop })
	if errors.Is(err, errStop) {
		err = nil
	}
	return n > 0, err
}

func (k *kafkaOutput) reset(ctx context.Context) error {
	cl, adm, err := k.admin()
	if err != nil {
		return err
	}
	defer cl.Close()
	resp, err := adm.DeleteTopics(ctx, k.topic)
	if err != nil {
		return err
	}
	for _, r := range resp {
		if r.Err != nil && !strings.Contains(r.Err.Error(), "UNKNOWN_TOPIC") {
			return r.Err
		}
	}
	return nil
}

// scan reads the topic from its start with read_committed isolation up to
// the last stable offsets.
func (k *kafkaOutput) scan(ctx context.Context, fn func(ReplayRow) error) error {
	ends, err := k.ends(ctx)
	if err != nil {
		return err
	}
	pending := map[int32]int64{}
	for p, end := range ends {
		if end > 0 {
			pending[p] = end
		}
	}
	if len(pending) == 0 {
		return nil
	}
	cl, err := kgo.NewClient(kgo.SeedBrokers(k.brokers...), kgo.ConsumeTopics(k.topic),
		kgo.FetchIsolationLevel(kgo.ReadCommitted()), kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()))
	if err != nil {
		return err
	}
	defer cl.Close()
	for len(pending) > 0 {
		fctx, cancel := context.WithTimeout(ctx, 2*time.Second)
		fetches := cl.PollFetches(fctx)
		cancel()
		if fctx.Err() != nil && fetches.NumRecords() == 0 {
			// Nothing more within the timeout: the rest of the
			// partitions' offsets are control records (commit markers).
			return nil
		}
		for _, fe := range fetches.Errors() {
			if !errors.Is(fe.Err, context.DeadlineExceeded) {
				return fmt.Errorf("Kafka: reading %s: %w", k.topic, fe.Err)
			}
		}
		var ferr error
		fetches.EachRecord(func(r *kgo.Record) {
			if ferr != nil {
				return
			}
			var row ReplayRow
			if err := json.Unmarshal(r.Value, &row); err != nil {
				ferr = fmt.Errorf("Kafka: %s partition %d offset %d: %v", k.topic, r.Partition, r.Offset, err)
				return
			}
			if err := fn(row); err != nil {
				ferr = err
			}
			if end, ok := pending[r.Partition]; ok && r.Offset+1 >= end {
				delete(pending, r.Partition)
			}
		})
		if ferr != nil {
			return ferr
		}
	}
	return nil
}

func (k *kafkaOutput) close() {
	if k.c != nil {
		k.c.Close()
	}
}
