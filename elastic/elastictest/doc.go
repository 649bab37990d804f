// Package elastictest helps tests of code built on package elastic: it makes
// an N-member cluster of Agents over one in-memory store and joins them all
// at once.
//
// # Use
//
//	c := elastictest.NewCluster(t, 3, elastictest.FastConfig("my-job"))
//	worlds := c.JoinAll(ctx) // one World per agent, same round
//
// Agents are closed by t.Cleanup. The store is NewMemoryStore (the same
// semantics as the Redis store, with controls for time, outages and a store
// restarted empty); pass a Redis store (store.NewRedis) with NewClusterOn to
// run the same test against real Redis.
package elastictest
