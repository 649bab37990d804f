// Package s3 is a trainer.CheckpointStore in S3-compatible object storage
// (any server that speaks the S3 API with single-object PUT, GET, DELETE,
// ListObjectsV2 and CopyObject; the tests run against VersityGW), for jobs
// whose workers share no filesystem.
//
//	st, err := s3.New(ctx, s3.Config{ /* from s3.DefaultConfig() */ })
//	tr, err := trainer.New(params, opt, loader, step, store, cfg, trainer.WithCheckpointStore(st))
//
// It is a module of its own (github.com/elastictrain/elastictrain/objstore/s3)
// so that a user who keeps checkpoints in a local directory
// (trainer.LocalDir) never downloads or compiles an S3 client.
//
// # Objects
//
// Under Config.Prefix, a checkpoint of global step S (S zero-padded to 20
// digits) is:
//
//	ckpt-<S>.parts/<token>/000000   the payload's first Config.PartSize bytes
//	ckpt-<S>.parts/<token>/000001   the next ones, ... (none for an empty payload)
//	ckpt-<S>.manifest               JSON: format "elastictrain-s3-checkpoint/1",
//	                                step, size and SHA-256 of the payload,
//	                                creation time, and each part's name,
//	                                size and SHA-256, in order
//
// token is 16 random hex digits drawn by each Save, so a Save never
// overwrites an object another Save wrote, and a repeated Save of one step
// never touches the parts the published manifest names.
//
// # Publishing without rename
//
// An object store has no rename, but a PUT of one object is atomic: readers
// see the old object or the whole new one, never a part of it. Save
// therefore writes every part first (each with one PUT carrying its MD5,
// which the server checks), and the manifest last: the manifest's PUT is
// the publication. List returns the steps of the manifests only, so a Save
// cut short (its writer killed, the server killed, the network gone) is
// never listed: it leaves parts that no manifest names, which CleanTemp
// deletes when the trainer restarts the job. A reader trusts nothing but a
// complete manifest: Load checks the manifest's format and step, that its
// parts are named under its own step and their sizes add up to the
// payload's, then every part's size and SHA-256, then the payload's
// SHA-256; any mismatch or missing part is trainer.ErrCorruptCheckpoint,
// and the manifest is set aside under "corrupt/" (copied, then deleted, if
// it is still the one read), so List stops returning it and the trainer
// falls back to the previous checkpoint.
//
// Keep-N pruning after a Save deletes each old checkpoint's manifest first
// and its parts after, so a checkpoint is unlisted before anything it names
// disappears. A server that dies mid-Save leaves every published
// checkpoint whole: nothing published is written or deleted before the new
// manifest is.
//
// # Client library
//
// The S3 client is minio-go v7 (Apache-2.0): one module with a handful of
// small dependencies (the AWS SDK v2 brings a module per service and per
// internal layer), built for any S3-compatible endpoint (path-style
// addressing for self-hosted servers, no region required), with the
// conditional copy (x-amz-copy-source-if-match) the set-aside uses.
//
// # Tests
//
// The tests build VersityGW (Apache-2.0, an S3 server with a POSIX
// backend) from the Go module proxy, pinned by the tools module in
// the core module's internal/s3server/tools, and run it as a process on a
// free port (see internal/s3server); no mock, no fake.
package s3
