package launch

import (
	"bytes"
	"encoding/json"
	"math"
	"os"
	"os/exec"
	"strings"
	"sync"
	"testing"

	"github.com/stretchr/testify/require"
)

// Every event a worker wrote reaches OnEvent, marked with its index, after
// its OnStart and before its OnExit; a line that is not an event arrives
// as an error naming it.
func TestEventsArriveBetweenStartAndExit(t *testing.T) {
	var mu sync.Mutex
	seen := map[int][]string{} // worker -> "start", event kinds, "exit"
	add := func(w int, what string) {
		mu.Lock()
		seen[w] = append(seen[w], what)
		mu.Unlock()
	}
	var loss float64
	hooks := Hooks{
		Prepare: func(p Process, cmd *exec.Cmd) error {
			require.Contains(t, cmd.Env, EnvEvents+"=3")
			return nil
		},
		OnStart: func(p Process) { add(p.Worker, "start") },
		OnEvent: func(ev Event) {
			what := ev.Ev
			if ev.Ev == EvError {
				what += ": " + ev.Message
			}
			if ev.Ev == EvStep {
				mu.Lock()
				loss = ev.Loss
				mu.Unlock()
			}
			add(ev.Worker, what)
		},
		OnExit: func(x Exit) { add(x.Worker, "exit") },
	}
	res, err := Run(t.Context(), fakeSpec(t, "events"), testConfig(3), WithHooks(hooks))
	require.NoError(t, err)
	require.Equal(t, Finished, res.Outcome)
	mu.Lock()
	defer mu.Unlock()
	require.Len(t, seen, 3)
	for w, got := range seen {
		require.Len(t, got, 6, "worker %d: %q", w, got)
		require.Equal(t, []string{"start", EvRound}, got[:2], "worker %d", w)
		require.True(t, strings.HasPrefix(got[2], `error: undecodable event "{not json"`), "worker %d: %q", w, got[2])
		require.Equal(t, []string{EvStep, EvDone, "exit"}, got[3:], "worker %d", w)
	}
	require.True(t, math.IsNaN(loss))
}

// Without OnEvent the workers get no events pipe.
func TestNoEventsPipeWithoutOnEvent(t *testing.T) {
	hooks := Hooks{Prepare: func(p Process, cmd *exec.Cmd) error {
		require.NotContains(t, strings.Join(cmd.Env, " "), EnvEvents+"=")
		require.Empty(t, cmd.ExtraFiles)
		return nil
	}}
	_, err := Run(t.Context(), fakeSpec(t, "exit 0"), testConfig(1), WithHooks(hooks))
	require.NoError(t, err)
}

func TestEmitterWithoutALauncherDiscards(t *testing.T) {
	t.Setenv(EnvEvents, "")
	t.Setenv(EnvWorker, "")
	NewEmitter().Emit(Event{Ev: EvStep, Step: 1}) // must not panic or write anywhere
}

// decodeLines decodes every line an Emitter wrote, as the launcher does.
func decodeLines(t *testing.T, b []byte) []Event {
	t.Helper()
	var out []Event
	for _, line := range bytes.Split(bytes.TrimSuffix(b, []byte("\n")), []byte("\n")) {
		var ev Event
		require.NoError(t, json.Unmarshal(line, &ev), "%s", line)
		out = append(out, ev)
	}
	return out
}

func TestEventsWithNonFiniteNumbersArrive(t *testing.T) {
	var buf bytes.Buffer
	e := NewEmitterTo(&buf, 3)
	e.Emit(Event{Ev: EvStep, Step: 7, Loss: math.NaN(), RecoverySeconds: math.Inf(1), Samples: 8})
	e.Emit(Event{Ev: EvStep, Step: 8, Loss: math.Inf(-1)})
	e.Emit(Event{Ev: EvStep, Step: 9, Loss: 0.25, RecoverySeconds: 1.5})
	e.Emit(Event{Ev: EvRound, Round: 2}) // zero floats stay omitted
	require.Contains(t, buf.String(), `"loss":"NaN"`)
	require.Contains(t, buf.String(), `"recovery_seconds":"+Inf"`)
	require.Contains(t, buf.String(), `"loss":0.25`)
	evs := decodeLines(t, buf.Bytes())
	require.Len(t, evs, 4)
	require.True(t, math.IsNaN(evs[0].Loss))
	require.True(t, math.IsInf(evs[0].RecoverySeconds, 1))
	require.Equal(t, 3, evs[0].Worker)
	require.Equal(t, os.Getpid(), evs[0].PID)
	require.EqualValues(t, 7, evs[0].Step)
	require.Equal(t, 8, evs[0].Samples)
	require.True(t, math.IsInf(evs[1].Loss, -1))
	require.Equal(t, 0.25, evs[2].Loss)
	require.Equal(t, 1.5, evs[2].RecoverySeconds)
	require.NotContains(t, strings.Split(buf.String(), "\n")[3], "loss")

	var ev Event
	require.ErrorContains(t, json.Unmarshal([]byte(`{"ev":"step","loss":"lots"}`), &ev), `"lots" is not a number`)
}

func TestAnEventThatCannotBeEncodedArrivesAsAnError(t *testing.T) {
	for name, extra := range map[string]map[string]any{
		"NaN in Extra":     {"test_accuracy": math.NaN()},
		"a func in Extra":  {"f": func() {}},
		"+Inf in a nested": {"m": map[string]float64{"x": math.Inf(1)}},
	} {
		t.Run(name, func(t *testing.T) {
			var buf bytes.Buffer
			NewEmitterTo(&buf, 0).Emit(Event{Ev: EvDone, Step: 12, Extra: extra})
			evs := decodeLines(t, buf.Bytes())
			require.Len(t, evs, 1)
			require.Equal(t, EvError, evs[0].Ev)
			require.Contains(t, evs[0].Message, `cannot encode this worker's "done" event (step 12)`)
			require.EqualValues(t, 12, evs[0].Step)
		})
	}
}
