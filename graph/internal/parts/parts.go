// Package parts gives the multi-process runtime (and graph's tests) the
// part builder of package graph (part.go) without a public API: package
// graph sets the functions below when it is initialized, taking a
// *graph.Job as job. Only packages under graph/ can import it.
//
// A part is one worker's share of one attempt of a job placed by
// cluster.Place: the chain subtasks placed on the worker, their
// mailboxes, and the channels with at least one end on it (in-memory
// when both ends are on it, network channels otherwise) and its own
// restore plan. The invariants are graph's PT1-PT6 (docs/design.md,
// "Placement: an attempt in parts").
package parts

import (
	"context"

	"github.com/cockroachdb/pebble/v2/vfs"

	"github.com/snapflow/snapflow/channel"
	"github.com/snapflow/snapflow/channel/netchan"
	"github.com/snapflow/snapflow/internal/runtime/cluster"
	"github.com/snapflow/snapflow/internal/runtime/execution"
	"github.com/snapflow/snapflow/internal/runtime/master"
	"github.com/snapflow/snapflow/internal/runtime/task"
	"github.com/snapflow/snapflow/restore"
	"github.com/snapflow/snapflow/snapshot"
)

// WorkerConfig configures a worker's side of a job (NewWorker).
type WorkerConfig struct {
	// ID is the worker's id in the placements it is given.
	ID string
	// Server is the worker's data plane: the reader's ends of the network
	// channels into its subtasks register on it. It must serve at the
	// worker's address in the placements.
	Server *netchan.Server
	// Dial configures the connections to the other workers' data planes
	// (their Placement.Workers addresses): one per peer, reused by every
	// channel to it and by every attempt.
	Dial netchan.DialConfig
}

// Worker is one worker's side of a job, across its attempts.
type Worker interface {
	// Part builds the worker's part of attempt a. Its chains run the
	// subtasks; the part's network channels are closed when the context
	// of any of its chains ends (the attempt ended).
	Part(a *Attempt) (*Part, error)
	// End runs the OnJobEnd hooks the worker's subtasks registered: the
	// execution ended for good (err as Execution.Wait would return it;
	// completed is the newest checkpoint it completed or restored).
	End(execution string, completed int64, err error)
	// Close closes the connections to the peers.
	Close() error
}

// Attempt is what a worker is told of one attempt of the job.
type Attempt struct {
	Number    int
	Execution string
	// Placement places every subtask of the job (cluster.Place of the
	// job's Shape); the worker builds those placed on it.
	Placement *cluster.Placement
	// Restore is the checkpoint or savepoint the attempt restores (nil:
	// empty state). The part loads the restore plan of its own subtasks
	// only (restore.Assign, then restore.LoadKeyedState of its tasks).
	Restore *Restore
	// KeyedState is the checkpoint storage the part's subtasks write their
	// keyed state to (nil without checkpoints).
	KeyedState snapshot.KeyedStateWriter
	// Reports receives the reports of the part's subtasks, for the job
	// master.
	Reports chan task.Report
}

// Restore names a checkpoint to restore: its path on FS (a checkpoint
// storage's FS, snapshot.Storage.FS, for an object store).
type Restore struct {
	FS   vfs.FS
	Path string
	// Plan, when set, is the plan of the whole job already loaded (in one
	// process); the part uses its own subtasks' state from it instead of
	// reading the checkpoint.
	Plan *restore.Plan
}

// Part is a worker's part of an attempt.
type Part struct {
	// Boxes are the indices, in the attempt's master box order (Boxes), of
	// the part's chain subtasks; Mailboxes and Chains are theirs, in the
	// same order. The job master's mail for box Boxes[k] goes to
	// Mailboxes[k].
	Boxes     []int
	Mailboxes []*task.Mailbox
	Chains    []execution.Chain
	// Channels are the part's channels, for their gauges (a network
	// channel's end on this worker).
	Channels []interface{ Gauges() channel.Gauges }
	// Plan is the restore plan the part loaded (nil without a restore):
	// its subtasks' state only.
	Plan *restore.Plan
	// Close aborts the part's network channels; ends that delivered end of
	// input are not affected. The part's chains call it when their
	// context ends; the caller calls it for a part that never ran.
	Close func()
}

var (
	// NewWorker returns the worker side of job for cfg. It fails when job
	// is not valid or cannot run in parts (the error names the operator).
	NewWorker func(job any, cfg WorkerConfig) (Worker, error)
	// Shape is job's shape, for cluster.Place and the fingerprint check.
	Shape func(job any) (*cluster.Shape, error)
	// Boxes are the job master's boxes of job: every chain subtask, in
	// the order of Part.Boxes' indices.
	Boxes func(job any) ([]master.Box, error)
	// Start runs job in this process as the parts that placement assigns
	// to workers (each a Worker of NewWorker), under one execution and job
	// master routing mail to the parts' mailboxes by box index. It returns
	// the *graph.Execution.
	Start func(ctx context.Context, job any, placement *cluster.Placement, workers []Worker) (any, error)
)
