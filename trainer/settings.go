package trainer

import (
	"context"
	"errors"
	"fmt"
	"math"
	"strconv"
	"strings"

	"github.com/elastictrain/elastictrain/elastic"
	"github.com/elastictrain/elastictrain/sync"
)

// ErrSettingsMismatch is returned by Run on every rank of a round whose
// members disagree on a setting that must be the same on every worker of
// a job. The round stops at once, before any state moves, and is not
// retried: a restarted worker would disagree again. The error is a
// *SettingsError naming the settings and the members; when their models
// differ, it matches ErrModelMismatch too. The settings compared are the
// model (parameter names, shapes, optimizer), Config.Epochs, the
// optimizer's learning rate when New was called (the configured base rate,
// not the current one, which hooks and restored commits change), the
// loader's global batch, dataset length and shuffle seed (a Loader's
// NewCursor, or DataSettings), Config.CommitEvery and
// Config.Deterministic.
var ErrSettingsMismatch = errors.New("trainer: workers disagree on the job's settings")

// SettingsError is the error of a settings disagreement: for each setting
// that differs, the value of every member of the round. It wraps
// ErrSettingsMismatch.
type SettingsError struct {
	// Round is the round in which the members met.
	Round uint64
	// Diffs holds one entry per setting that differs, in a fixed order.
	Diffs []SettingDiff
}

// SettingDiff is one setting on which a round's members disagree.
type SettingDiff struct {
	// Setting names it in words: "parameter <i> (name and shape)" (the
	// first parameter that differs) or "optimizer" when the models differ,
	// "model fingerprint (parameter names, shapes and optimizer)",
	// "parameter tensors", "parameter values",
	// "epochs", "learning rate", "global batch", "dataset length",
	// "shuffle seed", "commit interval", "deterministic mode".
	Setting string
	// Values holds each member's value, in rank order, as text.
	Values []string
	// Members holds the member IDs, in rank order.
	Members []string
}

func (e *SettingsError) Error() string {
	var b strings.Builder
	if e.Model() {
		b.WriteString("trainer: ranks hold different models; ")
	}
	fmt.Fprintf(&b, "trainer: workers disagree on the job's settings in round %d (every worker of a job must be configured the same):", e.Round)
	for i, d := range e.Diffs {
		if i > 0 {
			b.WriteString(";")
		}
		fmt.Fprintf(&b, " %s:", d.Setting)
		for r, v := range d.Values {
			if r > 0 {
				b.WriteString(",")
			}
			fmt.Fprintf(&b, " %s on rank %d (member %s)", v, r, d.Members[r])
		}
	}
	return b.String()
}

// Unwrap lets errors.Is(err, ErrSettingsMismatch) match.
func (e *SettingsError) Unwrap() error { return ErrSettingsMismatch }

// Is lets errors.Is(err, ErrModelMismatch) match when the members hold
// different models (the first three settings).
func (e *SettingsError) Is(target error) bool {
	return target == ErrModelMismatch && e.Model()
}

// Model reports whether the members hold different models: parameter
// names, shapes or optimizer differ.
func (e *SettingsError) Model() bool {
	for _, d := range e.Diffs {
		if d.Setting == jobSettings[0].name || d.Setting == jobSettings[1].name || d.Setting == jobSettings[2].name ||
			d.Setting == "optimizer" || strings.HasPrefix(d.Setting, "parameter ") {
			return true
		}
	}
	return false
}

// jobSetting is one compared setting: its name and how its value reads.
type jobSetting struct {
	name   string
	format func(float64) string
}

func formatInt(v float64) string {
	if v < 0 {
		return "unknown"
	}
	return strconv.FormatInt(int64(v), 10)
}

// jobSettings are the compared settings, in the order of settingsRow.
var jobSettings = []jobSetting{
	{"model fingerprint (parameter names, shapes and optimizer)", func(v float64) string { return strconv.FormatUint(uint64(v), 16) }},
	{"parameter tensors", formatInt},
	{"parameter values", formatInt},
	{"epochs", formatInt},
	{"learning rate", func(v float64) string { return strconv.FormatFloat(v, 'g', -1, 64) }}, // or its schedule's probe (WithSchedule)
	{"global batch", formatInt},
	{"dataset length", formatInt},
	{"shuffle seed", formatInt},
	{"commit interval", formatInt},
	{"deterministic mode", func(v float64) string { return strconv.FormatBool(v != 0) }},
}

// DataSettings is an optional capability of a StatefulLoader: the global
// batch and dataset length it was built with, in samples, which the
// trainer compares between the members of every round. A Loader's come
// from its NewCursor; a StatefulLoader without it is not compared on them.
type DataSettings interface {
	DataSettings() (globalBatch, datasetLen int)
}

// settingsRow is this worker's values of jobSettings, each exact in a
// float64 (-1: not known).
func (t *Trainer[B]) settingsRow() []float64 {
	batch, n, seed := -1.0, -1.0, -1.0
	switch l := t.loader.(type) {
	case *cursorLoader[B]:
		c := l.l.NewCursor()
		batch, n, seed = float64(c.GlobalBatch), float64(c.DatasetLen), float64(c.Seed&(1<<52-1))
	case DataSettings:
		gb, dl := l.DataSettings()
		batch, n = float64(gb), float64(dl)
	}
	det := 0.0
	if t.cfg.Deterministic {
		det = 1
	}
	return []float64{t.fp, float64(len(t.params)), float64(t.nvalues), float64(t.cfg.Epochs), t.baseLR, batch, n, seed, float64(t.cfg.CommitEvery), det}
}

// agreeSettings makes every rank of the round learn every rank's settings
// (one max-allreduce of a size × settings matrix in which each rank fills
// its row) and returns a *SettingsError, the same on every rank, when
// they differ.
func (t *Trainer[B]) agreeSettings(ctx context.Context, comm sync.Synchronizer, world elastic.World, watch *collectiveWatch) error {
	k := len(jobSettings)
	m := make([]float64, world.Size*k)
	for i := range m {
		m[i] = math.Inf(-1)
	}
	copy(m[world.Rank*k:], t.settingsRow())
	watch.enter()
	err := comm.AllReduceFloat64(ctx, m, sync.OpMax)
	watch.leave()
	if err != nil {
		return fmt.Errorf("trainer: settings agreement: %w", err)
	}
	ids := make([]string, world.Size)
	for r, mb := range world.Members {
		ids[r] = mb.ID
	}
	err = decideSettings(world.Round, m, ids)
	var se *SettingsError
	if errors.As(err, &se) && se.Model() {
		// Every rank took this branch: learn which tensor differs.
		watch.enter()
		descs, gerr := gatherBytes(ctx, comm, modelDesc(t.params, t.opt))
		watch.leave()
		if gerr == nil {
			se.Diffs = append(modelDiffs(descs, ids), se.Diffs...)
		}
	}
	return err
}

// modelDesc describes a model for modelDiffs: each parameter's name and
// shape, then the optimizer's name, separated by record separators.
func modelDesc(params []Param, opt Optimizer) []byte {
	var b []byte
	for _, p := range params {
		b = fmt.Appendf(b, "%q %v\x1e", p.Name, p.Shape)
	}
	return append(b, opt.Name()...)
}

// modelDiffs names the first parameter (in model order) whose name or
// shape differs between the ranks' descriptions, or the optimizer.
func modelDiffs(descs [][]byte, members []string) []SettingDiff {
	parts := make([][]string, len(descs))
	longest := 0
	for r, d := range descs {
		parts[r] = strings.Split(string(d), "\x1e")
		longest = max(longest, len(parts[r]))
	}
	at := func(r, i int) string {
		if i < len(parts[r])-1 {
			return parts[r][i]
		}
		return "none"
	}
	for i := 0; i < longest-1; i++ {
		for r := 1; r < len(parts); r++ {
			if at(r, i) != at(0, i) {
				d := SettingDiff{Setting: fmt.Sprintf("parameter %d (name and shape)", i), Members: members}
				for r := range parts {
					d.Values = append(d.Values, at(r, i))
				}
				return []SettingDiff{d}
			}
		}
	}
	d := SettingDiff{Setting: "optimizer", Members: members}
	for r := range parts {
		d.Values = append(d.Values, parts[r][len(parts[r])-1])
	}
	return []SettingDiff{d}
}

// decideSettings compares the rows of m (one per rank, len(jobSettings)
// values each) and returns a *SettingsError listing every setting on which
// they differ, or nil.
func decideSettings(round uint64, m []float64, members []string) error {
	k := len(jobSettings)
	var diffs []SettingDiff
	for s, js := range jobSettings {
		same := true
		for r := 1; r < len(members); r++ {
			if m[r*k+s] != m[s] {
				same = false
			}
		}
		if same {
			continue
		}
		d := SettingDiff{Setting: js.name, Members: members}
		for r := range members {
			d.Values = append(d.Values, js.format(m[r*k+s]))
		}
		diffs = append(diffs, d)
	}
	if len(diffs) == 0 {
		return nil
	}
	return &SettingsError{Round: round, Diffs: diffs}
}

// checkBaseLR rejects a base learning rate that cannot train: NaN,
// infinite, zero or negative. (A schedule may pass through 0; the
// configured base rate may not.)
func checkBaseLR(lr float64) error {
	if math.IsNaN(lr) || math.IsInf(lr, 0) || lr <= 0 {
		return fmt.Errorf("%w: the optimizer's learning rate %v is not a positive finite number", ErrInvalidConfig, lr)
	}
	return nil
}
