package sink

import "github.com/snapflow/snapflow/graph"

// WriteAndCommitWrapped is WriteAndCommitWith with the committer wrapped by
// wrap, so tests can inject faults around its hooks.
func WriteAndCommitWrapped[T, C any](in *graph.Stream[T], uid string, newWriter func(graph.TaskInfo) (Writer[T, C], error), c GlobalCommitter[C],
	retry Retry, sinkOpts []Option, wrap func(graph.SinkFunc[Committable[C]]) graph.SinkFunc[Committable[C]], opts ...graph.Option) {
	writeAndCommit(in, uid, newWriter, c, retry, sinkOpts, wrap, opts...)
}
