// Package control is the control plane of a job run across processes: a
// thin driver on gRPC around the pure cluster.Scheduler
// (internal/runtime/cluster). A Coordinator (the coordinator process)
// serves the workers' streams, owns the clock and the Scheduler, and
// carries out its actions by sending messages; RunWorker (each worker
// process) registers, heartbeats, and runs what it is sent on a Tasks the
// runtime implements. The data plane (channel/netchan) is separate: the
// control plane only tells each worker where the others' data planes
// listen.
//
// # One stream per worker
//
// A worker opens one bidirectional stream (Control/Attach) and keeps it
// for its registration: the first message registers, then heartbeats
// and reports flow up, deploys, cancels and mail flow down. The job
// master stays in the coordinator process and the control plane relays
// what it exchanges with the chain subtasks (boxes): task.Mail down
// (Coordinator.Mail, Tasks.Mail) and task.Report up (Reporter.Report,
// Reports), each as an opaque payload (task's wire encodings, W1-W4). Flink's TaskExecutor gateway is a set of RPCs
// each way; one stream is chosen here because it is the session: its end
// is the loss of the worker (the coordinator steps ConnectionLost at once
// instead of waiting for missed heartbeats) and, at the worker, the loss
// of the coordinator; the coordinator needs no connection to the worker
// (it dials nothing, so a worker behind a NAT or firewall works); and
// messages of one registration arrive in the order sent, so a cancel is
// never overtaken by the deploy of the next attempt. The service is
// hand-written (a grpc.ServiceDesc with a msgpack codec, no protoc), as
// channel/netchan's.
//
// # Invariants
//
//   - CP1 (coordinator.go). The Scheduler is driven by one goroutine: it
//     is the only one to step it, with the coordinator's clock read at
//     each event (CoordinatorConfig.Now; a tick at the Scheduler's next
//     deadline, or the test's ticks), and every action is carried out
//     before the next event is stepped. Events that arise while carrying out an action (a worker
//     dropped) are stepped after it, in order. It never waits for a
//     worker: a message is put on the worker's bounded queue (sendQueue)
//     and a sender goroutine per stream writes it; a worker whose queue
//     overflows is dropped (ConnectionLost).
//   - CP2 (coordinator.go). A worker is registered only with the job the
//     coordinator runs: its fingerprint must equal the coordinator's
//     shape's, else the stream is refused (FailedPrecondition) with
//     cluster.Check's words naming the first difference; the worker
//     stops (ErrRefused).
//   - CP3 (both). A lost peer is noticed both ways: the coordinator steps
//     ConnectionLost when a registered stream breaks, and its Scheduler
//     declares a worker lost whose heartbeats stop (CL5); a worker lost
//     or rejected has its stream ended by the coordinator. The
//     coordinator answers every heartbeat; a worker that hears nothing
//     for CoordinatorTimeout, or whose stream breaks, ends its session.
//     A stream is ended without waiting for its peer to read (its
//     handler returns, which cancels a SendMsg that waits), and neither
//     side's loop nor a task's report waits for a peer that stopped
//     reading: the worker too sends through a bounded queue, and ends
//     its session when it overflows.
//   - CP4 (both). Attempts are fenced. The coordinator takes reports
//     only of the live attempt, from the registration whose slots it
//     uses, and answers any other with a cancel of the attempt named;
//     Mail and CheckpointCompleted of an attempt that is not live fail,
//     as does Mail for a worker the live attempt places no task on. A
//     worker deploys only an attempt newer than every one deployed in its
//     session, cancels the one it runs first, and takes cancels and mail
//     of the attempt it runs only. A deploy carries the workers and slots of the placement; the
//     worker places its own shape (capped as asked) on those workers and
//     fails the attempt if its slots differ (Place is a function of shape
//     and workers, CL3).
//   - CP5 (worker.go). When a worker's session ends (the coordinator lost
//     or closed, the session rejected or declared lost, the worker
//     stopped), the attempt it runs is cancelled (Tasks.Cancel) before it
//     registers again; reports of a cancelled attempt are dropped.
//   - CP6 (security). The coordinator listens on the address it is given
//     only. With a secret configured, a stream is refused before any of
//     its messages is read unless it presents the secret (constant-time
//     compare, internal/rpcutil); the refusal says missing or wrong,
//     never a secret. Mutual TLS is the server's and the workers' gRPC
//     options (credentials.NewTLS, tls.RequireAndVerifyClientCert).
//   - CP7 (both). The relay keeps order: the letters of Coordinator.Mail
//     reach Tasks.Mail, and the payloads of Reporter.Report reach
//     Reports.Report, in the order each side sent them, per worker (one
//     stream, one sender goroutine; letters or reports queued behind one
//     another of the same attempt join one message, up to maxBatch bytes).
//     A worker hands an attempt's mail to Tasks.Mail only once its Deploy
//     returned: mail that comes earlier is held, then given in order. The
//     mail of a worker lost is dropped with its queue; its loss fails the
//     attempt, so no later Mail for it is taken (CP4).
package control
