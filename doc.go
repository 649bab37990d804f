// Package elastictrain is an embeddable Go SDK for elastic training loops.
//
// A Go program implements one step function; the SDK gives it rank assignment
// through a Redis rendezvous (package elastic), a resumable sharded data loader
// (package dataloader), gradient synchronisation by ring allreduce or a
// parameter server (package sync), and the elastic loop with commit, rollback,
// durable checkpoints, rescaling and OpenTelemetry tracing (package trainer).
//
// This root package holds only this overview; see the packages below it.
package elastictrain
