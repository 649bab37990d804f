package store

// JobKeys exposes jobKeys to the external tests (package store_test).
var JobKeys = jobKeys

// The scripts, for tests that count the calls of each.
var (
	ScriptRoster    = scriptRoster
	ScriptBeat      = scriptBeat
	ScriptHeartbeat = scriptHeartbeat
)
