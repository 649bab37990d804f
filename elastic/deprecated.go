package elastic

import (
	"log/slog"

	"github.com/redis/go-redis/v9"

	"github.com/elastictrain/elastictrain/elastic/store"
)

// The Store SPI, the memory and Redis stores and their test controls moved
// to package elastic/store (the stores) and elastic/elastictest (the test
// kit), as database/sql keeps its drivers' interfaces in database/sql/driver.
// The names below keep code written against the old ones compiling for one
// release; each is the moved name itself (a type alias, the same value or a
// wrapper), so values pass freely between the old and the new names.

// Store is the shared state of the rendezvous.
//
// Deprecated: use store.Store.
type Store = store.Store

// Watcher delivers change hints of one job.
//
// Deprecated: use store.Watcher.
type Watcher = store.Watcher

// JoinRequest is the argument of Store.Join.
//
// Deprecated: use store.JoinRequest.
type JoinRequest = store.JoinRequest

// MemberRequest names the calling member of a job.
//
// Deprecated: use store.MemberRequest.
type MemberRequest = store.MemberRequest

// ReportRequest is the argument of Store.Report.
//
// Deprecated: use store.ReportRequest.
type ReportRequest = store.ReportRequest

// View is the job state as one member sees it after a store call.
//
// Deprecated: use store.View.
type View = store.View

// Beat is the result of a heartbeat.
//
// Deprecated: use store.Beat.
type Beat = store.Beat

// Hint is a change notification of one job.
//
// Deprecated: use store.Hint.
type Hint = store.Hint

// Params are the rendezvous settings a Store applies in one call.
//
// Deprecated: use store.Params.
type Params = store.Params

// Code is the outcome of a store call that reached the store.
//
// Deprecated: use store.Code.
type Code = store.Code

// The outcomes of a store call.
//
// Deprecated: use store.CodeOK, store.CodeFenced, store.CodeLost and
// store.CodeFinished.
const (
	CodeOK       = store.CodeOK
	CodeFenced   = store.CodeFenced
	CodeLost     = store.CodeLost
	CodeFinished = store.CodeFinished
)

// Role is the caller's place in the job state.
//
// Deprecated: use store.Role.
type Role = store.Role

// The roles of a member in the job state.
//
// Deprecated: use store.RoleNone, store.RoleRanked, store.RoleArrived,
// store.RoleExpected and store.RolePending.
const (
	RoleNone     = store.RoleNone
	RoleRanked   = store.RoleRanked
	RoleArrived  = store.RoleArrived
	RoleExpected = store.RoleExpected
	RolePending  = store.RolePending
)

// MemoryStore is the Store kept in process memory.
//
// Deprecated: use store.Memory.
type MemoryStore = store.Memory

// NewMemoryStore returns an empty in-memory store.
//
// Deprecated: use store.NewMemory.
func NewMemoryStore() Store { return store.NewMemory() }

// NewMemoryStoreForTest returns an in-memory store with its test controls
// (SetClock, SetDown, Drop) reachable.
//
// Deprecated: use elastictest.NewMemoryStore, or store.NewMemory.
func NewMemoryStoreForTest() *MemoryStore { return store.NewMemory() }

// RedisStore is the Store over Redis.
//
// Deprecated: use store.Redis.
type RedisStore = store.Redis

// NewRedisStore returns a Store over the given client.
//
// Deprecated: use store.NewRedis.
func NewRedisStore(c redis.UniversalClient) *RedisStore { return store.NewRedis(c) }

// KeyPrefix starts every Redis key and channel of the rendezvous.
//
// Deprecated: use store.KeyPrefix.
const KeyPrefix = store.KeyPrefix

// RedisLog forwards go-redis' own log lines to a *slog.Logger.
//
// Deprecated: use store.RedisLog.
type RedisLog = store.RedisLog

// RedisLogger returns a RedisLog writing to l (nil: discard).
//
// Deprecated: use store.RedisLogger.
func RedisLogger(l *slog.Logger) *RedisLog { return store.RedisLogger(l) }
