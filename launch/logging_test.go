package launch_test

import (
	"bytes"
	"encoding/json"
	"log/slog"
	"os"
	"testing"
	"time"

	"github.com/elastictrain/elastictrain/launch"
)

// A JSON log written through ReplaceDurations carries durations as Go
// duration strings, in groups too; other values are unchanged.
func TestReplaceDurationsWritesDurationStrings(t *testing.T) {
	var buf bytes.Buffer
	log := slog.New(slog.NewJSONHandler(&buf, &slog.HandlerOptions{ReplaceAttr: launch.ReplaceDurations}))
	log.Info("recovered", "after", 1500*time.Millisecond, "steps", 3, slog.Group("lease", "ttl", 2*time.Second))
	var rec struct {
		After string `json:"after"`
		Steps int    `json:"steps"`
		Lease struct {
			TTL string `json:"ttl"`
		} `json:"lease"`
	}
	if err := json.Unmarshal(buf.Bytes(), &rec); err != nil {
		t.Fatalf("%v: %s", err, buf.Bytes())
	}
	if rec.After != "1.5s" || rec.Lease.TTL != "2s" || rec.Steps != 3 {
		t.Fatalf("got %s", buf.Bytes())
	}
}

// ExampleReplaceDurations gives a worker's JSON log durations an operator
// can read.
func ExampleReplaceDurations() {
	h := slog.NewJSONHandler(os.Stdout, &slog.HandlerOptions{
		ReplaceAttr: func(groups []string, a slog.Attr) slog.Attr {
			if a.Key == slog.TimeKey && len(groups) == 0 {
				return slog.Attr{} // a stable output for the example
			}
			return launch.ReplaceDurations(groups, a)
		}})
	slog.New(h).Info("store reachable again", "after", 2300*time.Millisecond)
	// Output: {"level":"INFO","msg":"store reachable again","after":"2.3s"}
}
