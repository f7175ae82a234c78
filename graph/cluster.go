package graph

import "github.com/snapflow/snapflow/internal/runtime/cluster"

// clusterShape describes the validated job to the multi-process runtime
// (internal/runtime/cluster): every process builds the job and compares
// the fingerprints of their shapes before running any of it (CL1).
func (j *Job) clusterShape() *cluster.Shape {
	s := &cluster.Shape{Job: j.ID()}
	for _, v := range j.vertices {
		s.Operators = append(s.Operators, cluster.Operator{
			UID: v.uid, Name: v.name, Kind: v.kind.String(),
			Parallelism: v.parallelism, MaxParallelism: v.maxParallelism, Keyed: v.keyed,
		})
	}
	for _, v := range j.vertices {
		for _, e := range v.outputs {
			id := e.id()
			s.Edges = append(s.Edges, cluster.Edge{
				From: id.From, To: id.To, Index: id.Index, Part: id.Part,
				Chained: e.chained, Feedback: e.feedback, Side: e.side, Records: e.elem.String(),
			})
		}
	}
	return s
}
