// Package driver is the trainer's service-provider interface: what an
// implementer of a strategy, a checkpoint store or a data loader provides
// to package trainer, the way database/sql/driver is what a database
// driver provides to database/sql. A user who trains a model needs package
// trainer only; one who writes a Backend (how gradients move between the
// ranks of a round), a Partition (state split across the ranks, such as
// the parameter server of trainer/ps), a CheckpointStore or a loader
// (Loader, StatefulLoader) implements the interfaces here.
//
// Optional capabilities are interfaces of their own, found by type
// assertion: a round's Synchronizer may be a LocalStepper or a
// GradientReducer, a loader a MicroBatcher, a StatefulLoader a
// StateMerger, CommitListener, LineageSetter, Weighter or DataSettings, a
// Partition Releasable, a CheckpointStore a TempCleaner.
//
// Names in the documentation below without a package (New, Run, Config,
// WithBackend, WithPartition, WithCheckpointStore, Param, Hooks) are
// package trainer's. Package trainer keeps each name here as a deprecated
// alias of the same type for one release.
//
// Beneath it are the standard library and the two packages whose values
// the loop hands across: sync (World, Synchronizer) and dataloader
// (Batch, Cursor, StepOutcome); none of them imports the trainer.
package driver
