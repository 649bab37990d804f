// Package standalone runs an embedded Redis-protocol server on loopback for
// single-host elastic jobs, in the spirit of torchrun's "standalone" mode: one
// process hosts the rendezvous store and every worker on the host points its
// Redis client at it.
//
// # What it is
//
// The server is github.com/alicebob/miniredis/v2, an in-process Redis
// implementation that speaks RESP over TCP and runs Lua scripts and Pub/Sub.
// miniredis keeps TTLs on a virtual clock that only moves when asked; Server
// drives that clock from a ticker goroutine (every 10 ms it advances the TTLs by
// the wall time elapsed), so keys expire in real time like on a real Redis.
// Lease expiry in package elastic therefore works against it unchanged.
//
// # Limits
//
// State lives in the memory of the hosting process and dies with it; there is
// no persistence and no replication. Use a real Redis (one node, Sentinel or
// Cluster) when workers span hosts or when the host process may crash while
// the job must go on.
//
// Every local process can connect, and the server checks each request's
// framing before it allocates for it: a bulk string of more than 32 MiB, more
// than 2^20 arguments, a header line over 64 bytes or any line over 64 KiB
// closes that client's connection (after the answers to its requests before
// it), and the server serves the others on.
//
// # Lifetime
//
// Start returns a running server; Close stops the ticker goroutine and the
// listener and waits for both. A Server is safe for concurrent use.
package standalone
