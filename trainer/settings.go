package trainer

import (
	"context"
	"errors"
	"fmt"
	"math"
	"reflect"
	"slices"
	"strconv"
	"strings"

	"github.com/elastictrain/elastictrain/elastic"
	"github.com/elastictrain/elastictrain/sync"
	"github.com/elastictrain/elastictrain/trainer/driver"
	"github.com/elastictrain/elastictrain/trainer/internal/enc"
	"github.com/elastictrain/elastictrain/trainer/optim"
	"github.com/elastictrain/elastictrain/worker"
)

// SettingsError is the error of a settings disagreement: for each setting
// that differs, the value of every member of the round. It wraps
// ErrSettingsMismatch.
type SettingsError struct {
	// Round is the round in which the members met.
	Round uint64
	// Diffs holds one entry per setting that differs, in a fixed order.
	Diffs []SettingDiff
	// Refused holds the member IDs of the members refused by the members
	// that hold the job's trained state, who train on (see
	// ErrSettingsMismatch), in rank order; empty when every member of the
	// round stopped.
	Refused []string
}

// SettingDiff is one setting on which a round's members disagree.
type SettingDiff struct {
	// Setting names it in words: "parameter <i> (name and shape)" (the
	// first parameter that differs) or "optimizer" when the models differ,
	// "model fingerprint (parameter names, shapes and optimizer)",
	// "parameter tensors", "parameter values",
	// "epochs", "learning rate", "global batch", "dataset length",
	// "shuffle seed", "commit interval", "deterministic mode",
	// "gradient bucket bytes"; for the sync transport's layout (compared
	// by its handshake, see ErrSettingsMismatch) "sync chunk bytes",
	// "sync direct bytes", "sync streams", "sync hierarchy", whose Values
	// read "unknown" for a member whose layout the reporting worker did
	// not learn.
	Setting string
	// Values holds each member's value, in rank order, as text: the value
	// as configured (the optimizer's learning rate at New, a Schedule's
	// fields, the full shuffle seed), not an encoding of it.
	Values []string
	// Members holds the member IDs, in rank order.
	Members []string
}

func (e *SettingsError) Error() string {
	var b strings.Builder
	if e.Model() {
		b.WriteString("trainer: ranks hold different models; ")
	}
	switch {
	case len(e.Refused) > 0 && e.layout():
		fmt.Fprintf(&b, "trainer: refused by the job in round %d: the sync transport layout of member %s differs from that of the job's members (the round's majority), "+
			"which train on without it (every worker of a job must be configured the same):", e.Round, strings.Join(e.Refused, ", "))
	case len(e.Refused) > 0:
		fmt.Fprintf(&b, "trainer: refused by the job in round %d: the settings of member %s differ from those of the members that hold the job's trained state, "+
			"which train on without it (every worker of a job must be configured the same):", e.Round, strings.Join(e.Refused, ", "))
	default:
		fmt.Fprintf(&b, "trainer: workers disagree on the job's settings in round %d (every worker of a job must be configured the same):", e.Round)
	}
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

// layout reports whether the settings that differ are the sync
// transport's layout (compared by its handshake, not by agreeSettings).
func (e *SettingsError) layout() bool {
	return len(e.Diffs) > 0 && strings.HasPrefix(e.Diffs[0].Setting, "sync ")
}

// Unwrap lets errors.Is(err, ErrSettingsMismatch) match.
func (e *SettingsError) Unwrap() error { return ErrSettingsMismatch }

// Is lets errors.Is(err, ErrModelMismatch) match when the members hold
// different models (the first three settings), and errors.Is(err,
// worker.ErrRefused) when the job's members refused this worker (Refused
// is not empty), which is how launch.ExitStatus tells StatusRefused.
func (e *SettingsError) Is(target error) bool {
	switch target {
	case ErrModelMismatch:
		return e.Model()
	case worker.ErrRefused:
		return len(e.Refused) > 0
	}
	return false
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
	{"gradient bucket bytes", formatInt}, // the fused buffers' layout is the collectives' (Config.BucketBytes)
}

// DataSettings is an optional capability of a StatefulLoader: the global
// batch and dataset length it was built with, in samples, which the
// trainer compares between the members of every round. A Loader's come
// from its NewCursor; a StatefulLoader without it is not compared on them.
//
// Deprecated: use driver.DataSettings, the same type.
type DataSettings = driver.DataSettings

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
	if t.det {
		det = 1
	}
	return []float64{t.fp, float64(len(t.params)), float64(t.nvalues), float64(t.cfg.Epochs), t.baseLR, batch, n, seed, float64(t.cfg.CommitEvery), det,
		float64(t.cfg.BucketBytes)}
}

// settingsText is this worker's values of jobSettings as configured, for
// the message of a disagreement (settingsRow holds numbers that compare
// exactly, some of them derived: a Schedule's probe, a 52-bit seed),
// after its model's description (modelDesc).
func (t *Trainer[B]) settingsText(row []float64) []byte {
	b := enc.AppendBytes(nil, modelDesc(t.params, t.opt))
	for s, js := range jobSettings {
		v := js.format(row[s])
		switch js.name {
		case "learning rate":
			if t.o.sched != nil {
				v = describeSchedule(t.o.sched)
			}
		case "shuffle seed":
			if l, ok := t.loader.(*cursorLoader[B]); ok {
				v = strconv.FormatUint(l.l.NewCursor().Seed, 10)
			}
		}
		b = enc.AppendBytes(b, []byte(v))
	}
	return b
}

// describeSchedule is a Schedule as configured: its String when it has
// one, its type and fields when it is a struct (WarmupCosine{Base:0.2
// ...}), else its rates at steps 0, 1 and 1000.
func describeSchedule(s Schedule) string {
	if st, ok := s.(fmt.Stringer); ok {
		return st.String()
	}
	if v := reflect.Indirect(reflect.ValueOf(s)); v.Kind() == reflect.Struct {
		return fmt.Sprintf("%v%+v", v.Type(), v.Interface())
	}
	return fmt.Sprintf("a schedule with rates %g, %g, %g at steps 0, 1, 1000", s.LR(0), s.LR(1), s.LR(1000))
}

// holdsColumn is the column of the settings matrix, after jobSettings, in
// which a member says whether it holds the job's trained state.
var holdsColumn = len(jobSettings)

// agreeSettings makes every rank of the round learn every rank's settings
// and whether it holds the job's trained state (one max-allreduce of a
// size × (settings+1) matrix in which each rank fills its row) and returns
// a *SettingsError, the same on every rank, when they differ (see
// ErrSettingsMismatch and decideSettings for who stops). On a
// disagreement every rank also gathers every rank's settings as
// configured, for the message.
func (t *Trainer[B]) agreeSettings(ctx context.Context, comm sync.Synchronizer, world elastic.World, watch *collectiveWatch) error {
	k := len(jobSettings) + 1
	m := make([]float64, world.Size*k)
	for i := range m {
		m[i] = math.Inf(-1)
	}
	row := t.settingsRow()
	copy(m[world.Rank*k:], row)
	if t.latest != nil {
		m[world.Rank*k+holdsColumn] = 1
	} else {
		m[world.Rank*k+holdsColumn] = 0
	}
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
	if !errors.As(err, &se) {
		return err
	}
	// Every rank took this branch: learn the values as configured, and
	// which tensor differs when the models do.
	watch.enter()
	texts, gerr := gatherBytes(ctx, comm, t.settingsText(row))
	watch.leave()
	if gerr != nil {
		t.log.Warn("cannot learn the other members' settings as configured", "err", gerr)
		return err
	}
	descs := make([][]byte, len(texts))
	values := make([][]string, len(texts))
	for r, b := range texts {
		rd := enc.Reader{B: b}
		descs[r] = rd.Bytes()
		for range jobSettings {
			values[r] = append(values[r], string(rd.Bytes()))
		}
		if rerr := rd.Done(); rerr != nil {
			t.log.Warn("a member's settings as configured do not decode", "rank", r, "err", rerr)
			return err
		}
	}
	for i, d := range se.Diffs {
		s := slices.IndexFunc(jobSettings, func(js jobSetting) bool { return js.name == d.Setting })
		for r := range d.Values {
			se.Diffs[i].Values[r] = values[r][s]
		}
	}
	if se.Model() {
		se.Diffs = append(modelDiffs(descs, ids), se.Diffs...)
	}
	return err
}

// modelDesc describes a model for modelDiffs: each parameter's name and
// shape, then the optimizer's name, separated by record separators.
func modelDesc(params []Param, opt optim.Optimizer) []byte {
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

// decideSettings compares the rows of m (one per rank: len(jobSettings)
// values, then 1 when the rank holds the job's trained state) and returns
// a *SettingsError listing every setting on which they differ, or nil.
// When the ranks that hold trained state agree with one another, the
// ranks that hold none and differ from them are refused
// (SettingsError.Refused; the diffs list every member's values) and the
// others go on; when no rank holds it, or the holders disagree,
// Refused is empty: every rank stops.
func decideSettings(round uint64, m []float64, members []string) error {
	k := len(jobSettings) + 1
	n := len(jobSettings)
	holder := -1
	agree := true // the holders agree with one another
	for r := range members {
		if m[r*k+holdsColumn] != 1 {
			continue
		}
		if holder < 0 {
			holder = r
		} else if !slices.Equal(m[r*k:r*k+n], m[holder*k:holder*k+n]) {
			agree = false
		}
	}
	if holder >= 0 && agree {
		var refused []string
		for r := range members {
			if m[r*k+holdsColumn] != 1 && !slices.Equal(m[r*k:r*k+n], m[holder*k:holder*k+n]) {
				refused = append(refused, members[r])
			}
		}
		if len(refused) == 0 {
			return nil
		}
		err := compareSettings(round, m, members)
		err.(*SettingsError).Refused = refused
		return err
	}
	if err := compareSettings(round, m, members); err != nil {
		return err
	}
	return nil
}

// compareSettings returns a *SettingsError listing every setting of
// jobSettings on which the rows of m differ, or nil.
func compareSettings(round uint64, m []float64, members []string) error {
	k := len(jobSettings) + 1
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
