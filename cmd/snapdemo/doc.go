// Command snapdemo replays a device-signals dataset through a checkpointed
// job (source -> keyBy(device) -> per-device step -> two-phase-commit sink),
// crashes it once, restores it from the latest completed checkpoint and
// shows that every device signal was published exactly once, followed by
// the checkpoint statistics.
//
// With no arguments it replays the seed's nine device signals (embedded
// from data/device-signals.json) and fails the first attempt at offset 6,
// as the seed's Flink demo does. The checkpoints go to
// <dir>/9866061bb8a60fea0dd2a67785e8ec5b (the MD5 of "12345_DemoJob").
//
// Usage:
//
//	snapdemo [-data FILE] [-dir DIR [-keep]] [-interval D] [-pace D] [-fail-at N] [-mode aligned|unaligned|at-least-once]
package main
