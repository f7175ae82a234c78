// Package objstore is the checkpoint-storage layer under package
// snapshot: a Store of write-once objects over a local directory (Dir)
// or a gocloud.dev/blob bucket (Bucket: S3, GCS, Azure, fileblob,
// memblob), and Job, what makes a checkpoint complete on a store that
// has no atomic rename and no append. The invariants are OS1-OS8.
package objstore
