package mnist

import (
	"bytes"
	"encoding/json"
	"testing"
	"time"
)

// The worker's JSON log (-log-format json) writes durations as Go duration
// strings, as its text log does, not as integers of nanoseconds.
func TestJSONLogDurationsAreStrings(t *testing.T) {
	var buf bytes.Buffer
	log := newLogger(&config{logFormat: "json", logLevel: "info", job: "j"}, &buf)
	log.Info("store reachable again", "after", 1500*time.Millisecond)
	var rec map[string]any
	if err := json.Unmarshal(buf.Bytes(), &rec); err != nil {
		t.Fatalf("%v: %s", err, buf.Bytes())
	}
	if rec["after"] != "1.5s" {
		t.Fatalf("after = %#v, want \"1.5s\": %s", rec["after"], buf.Bytes())
	}
}
