// Command snapdemo shows snapflow's checkpoints at work: keyed jobs that
// replay a dataset, crash, restore from their latest completed checkpoint
// and commit every input record exactly once, judged by record identity.
//
// Usage:
//
//	snapdemo [--data FILE] [--dir DIR [--keep]] [--interval D] [--pace D] [--fail-at N] [--mode M]
//	snapdemo replay [--data FILE|builtin:device-signals|builtin:sensors] [--key F] [--id F,...]
//	                [--checkpoint-dir DIR] [--interval D] [--mode aligned|unaligned|at-least-once]
//	                [--aligned-timeout D] [--parallelism N] [--fail-at-offset N] [--restore latest|PATH]
//	                [--allow-fallback] [--sink DIR|postgres://...|kafka://host:port/topic] [--state pebble|heap] [--rate R]
//	                [--fresh] [--json] [--progress auto|bar|log|none]
//	snapdemo gen [--devices N] [--records N] [--seed S] [--disorder D] [--format ndjson|csv|json] [--out FILE]
//	snapdemo checkpoints DIR [--json]
//	snapdemo inspect PATH [--operator UID [--state NAME [--key K] [--limit N]]] [--json]
//	snapdemo savepoint DIR [--stop] [--timeout D] [--json]
//	snapdemo verify [--data ...] [--kills K] [--seed S] [--modes M,...] [--parallelism P,...] [--json]
//	snapdemo bench [--scenario S,...] [--repeat N] [--out DIR] [--quick] [--beam auto|off|DIR]
//
// Every command has --help with examples; --verbose logs the engine's
// notes and --log-format json makes the logs (on stderr) JSON lines.
//
// # The demo
//
// With no command, snapdemo replays the seed's nine device signals
// (embedded from data/device-signals.json) through source -> keyBy(device)
// -> per-device step -> file table and fails the first attempt at offset
// 6, as the seed's Flink demo does; the job restores the latest completed
// checkpoint and finishes, and the narrative tells which records were
// replayed and why none is committed twice. The checkpoints go to
// <dir>/checkpoints/9866061bb8a60fea0dd2a67785e8ec5b (the MD5 of
// "12345_DemoJob"). The flags of the demo also take the old one-dash form
// (-data FILE).
//
// # inspect
//
// inspect reads a checkpoint or savepoint without a job (package
// snapshot/inspect, like Flink's State Processor API): every operator with
// its subtasks' key-group ranges, its keyed states (layout, entries,
// bytes) and list states (a source's positions); with --operator the list
// elements, with --state the entries of one keyed state decoded without
// the job's types, with --key the entries of one key and the key group and
// subtask that own it (restore a savepoint at another parallelism and
// inspect again to watch the key move).
//
// # replay
//
// replay streams any dataset through snapflow's file sources (NDJSON, one
// JSON array, CSV; never loaded whole, split by byte ranges, positions in
// the checkpoints) into a keyed job whose per-key state counts the records
// and keeps the last value of every numeric field, and into a sink: a file
// table, PostgreSQL (prepared transactions) or Kafka (transactional
// producers). At the end it reads the committed output back and judges
// exactly-once by record identity: the --id field(s) ("offset" or "id" by
// default; builtin:sensors uses mote_id+reading), or a hash of the
// record's content. Ctrl-C cancels the job, keeping its checkpoints; the
// same command with --restore latest resumes it (the message counts the
// checkpoints on disk). If the newest checkpoint is damaged, --restore
// latest refuses; --allow-fallback restores the newest restorable older
// one, logging which it skipped and why, with the sink as a new commit
// user (it commits the records between them again). A fresh run over an
// earlier one's checkpoints or rows is refused unless --fresh deletes them.
// The verdict logs that it reads the input and the rows back, and how long
// that took.
//
// builtin:sensors is the single-hop sensor network readings of
// data/sensor-network (CC BY 4.0; its NOTICE and README ship with it and
// replay prints the attribution).
//
// # savepoint
//
// A running replay serves a control endpoint on a loopback port and names
// it in <job dir>/_control.json (removed when it ends; a killed replay
// leaves it behind, and its port does not answer), with a random token:
// the file is readable by its owner only (0600), and the endpoint refuses
// requests without the token (401) and cross-site ones (403; see
// control.go). savepoint DIR asks it
// for a savepoint (Execution.TriggerSavepoint), and with --stop to stop
// with one (Execution.Stop: the sinks commit what it covers); that replay
// then judges its committed rows with the records after the savepoint as
// pending, and a replay with --restore PATH, at any parallelism, commits
// them. A second replay of a job whose replay is running is refused.
//
// # verify
//
// verify runs replay as child processes (the same binary), SIGKILLs them
// at random points drawn from --seed, restarts each with --restore latest,
// and prints a verdict table per mode and parallelism. Exactly-once modes
// (aligned, unaligned) must commit every record exactly once;
// at-least-once must lose none and may commit duplicates (replay judges
// the same way).
//
// # Exit codes
//
//	0    success, and every verdict held
//	1    the job failed (including a bad record found in the input while
//	     streaming), or a verdict was violated (a duplicate or a lost record)
//	2    usage error: a bad flag or argument, or an input that cannot be used
//	     (a missing file, an empty dataset, a malformed first record, a key
//	     field the records do not have, an earlier run in the way)
//	130  interrupted by Ctrl-C (SIGINT) or SIGTERM; the checkpoints are kept
package main
