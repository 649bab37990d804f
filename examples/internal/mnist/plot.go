package mnist

import (
	"cmp"
	"errors"
	"fmt"
	"image/color"
	"math"
	"os"
	"slices"
	"strconv"

	"gonum.org/v1/plot"
	"gonum.org/v1/plot/plotter"
	"gonum.org/v1/plot/vg"
	"gonum.org/v1/plot/vg/draw"
	"gonum.org/v1/plot/vg/vgimg"

	"github.com/elastictrain/elastictrain/launch/monitor"
)

// Size of the -plot image.
const (
	plotWidth  = 24 * vg.Centimeter
	plotHeight = 16 * vg.Centimeter
	plotDPI    = 120
)

var (
	colLoss     = color.RGBA{R: 0x9e, G: 0xc3, B: 0xe6, A: 0xff} // raw per-step loss
	colLossMean = color.RGBA{R: 0x1f, G: 0x4e, B: 0x9a, A: 0xff} // its moving mean
	colWorld    = color.RGBA{R: 0x22, G: 0x22, B: 0x22, A: 0xff}
	colFailure  = color.RGBA{R: 0xc6, G: 0x28, B: 0x28, A: 0xff} // a round begun after a failure
	colChange   = color.RGBA{R: 0x2e, G: 0x7d, B: 0x32, A: 0xff} // a round begun by a join or a graceful leave
)

// errNoSteps is returned by writePlot when the summary has no step to draw.
var errNoSteps = errors.New("no step was reported, nothing to plot")

// writePlot draws the job as a PNG at path: the loss of every step of the
// final history (log scale, with its moving mean) in the upper panel, the
// world size against step in the lower one, and a dashed vertical mark at
// the step each new round continued from, labelled with its world size (red
// after a failure, green after a join or a graceful leave).
func writePlot(path string, sum monitor.Summary) (err error) {
	// gonum/plot panics on some degenerate ranges; writePlot avoids them,
	// and turns any that slips through into an error rather than a crash
	// at the end of a finished job.
	defer func() {
		if r := recover(); r != nil {
			err = fmt.Errorf("drawing %s: %v", path, r)
		}
	}()
	steps := finalHistory(sum.Steps)
	if len(steps) == 0 {
		return errNoSteps
	}
	rounds := slices.Clone(sum.Rounds)
	slices.SortFunc(rounds, func(a, b monitor.RoundSeen) int { return cmp.Compare(a.Round, b.Round) })
	lastStep := steps[len(steps)-1].Step
	xmax := float64(max(lastStep, 1))

	top, err := lossPanel(steps, rounds, xmax)
	if err != nil {
		return err
	}
	bottom, err := worldPanel(steps, rounds, xmax)
	if err != nil {
		return err
	}

	img := vgimg.NewWith(vgimg.UseWH(plotWidth, plotHeight), vgimg.UseDPI(plotDPI))
	dc := draw.New(img)
	pad := 3 * vg.Millimeter
	dc = draw.Crop(dc, pad, -pad, pad, -pad)
	split := dc.Min.Y + (dc.Max.Y-dc.Min.Y)*0.36
	cTop := draw.Canvas{Canvas: dc.Canvas, Rectangle: vg.Rectangle{Min: vg.Point{X: dc.Min.X, Y: split + pad}, Max: dc.Max}}
	cBottom := draw.Canvas{Canvas: dc.Canvas, Rectangle: vg.Rectangle{Min: dc.Min, Max: vg.Point{X: dc.Max.X, Y: split}}}
	cTop, cBottom = alignX(top, cTop, bottom, cBottom)
	top.Draw(cTop)
	bottom.Draw(cBottom)

	f, err := os.Create(path)
	if err != nil {
		return err
	}
	if _, err := (vgimg.PngCanvas{Canvas: img}).WriteTo(f); err != nil {
		f.Close()
		return fmt.Errorf("writing %s: %w", path, err)
	}
	return f.Close()
}

// finalHistory keeps, for each step number, the last report of it: a step
// rolled back by a failure is trained again in a later round, and only that
// later report is part of the final model's history. Non-finite losses are
// kept (the world size is still known) and skipped by the loss panel.
func finalHistory(in []monitor.StepSeen) []monitor.StepSeen {
	last := map[int64]monitor.StepSeen{}
	for _, s := range in {
		if p, ok := last[s.Step]; !ok || s.Round >= p.Round {
			last[s.Step] = s
		}
	}
	out := make([]monitor.StepSeen, 0, len(last))
	for _, s := range last {
		out = append(out, s)
	}
	slices.SortFunc(out, func(a, b monitor.StepSeen) int { return cmp.Compare(a.Step, b.Step) })
	return out
}

// lossPanel plots the per-step loss and its trailing moving mean.
func lossPanel(steps []monitor.StepSeen, rounds []monitor.RoundSeen, xmax float64) (*plot.Plot, error) {
	p := plot.New()
	p.Title.Text = "MNIST: training loss and world size against step"
	p.Y.Label.Text = "training loss"
	p.X.Min, p.X.Max = 0, xmax
	p.X.Tick.Marker = unlabelled{plot.DefaultTicks{}}
	p.Add(plotter.NewGrid())

	var raw plotter.XYs
	for _, s := range steps {
		if !math.IsInf(s.Loss, 0) && !math.IsNaN(s.Loss) && s.Loss > 0 {
			raw = append(raw, plotter.XY{X: float64(s.Step), Y: s.Loss})
		}
	}
	// The marks go first so the curves are drawn over them.
	marks := &roundMarks{rounds: rounds}
	p.Add(marks)
	// The legend, marks' entries included, sits in the upper right, where
	// the loss has fallen away.
	p.Legend.Top = true
	p.Legend.Padding = vg.Points(2)
	defer marks.addLegend(p) // after the loss entries, on every return
	if len(raw) == 0 {
		// Nothing finite and positive to draw on a log scale: an empty
		// panel with a unit range says so without failing the plot.
		p.Y.Min, p.Y.Max = 0, 1
		return p, nil
	}
	window := min(max(len(raw)/40, 1), 100)
	lo, hi := math.Inf(1), math.Inf(-1)
	for _, xy := range raw {
		lo, hi = math.Min(lo, xy.Y), math.Max(hi, xy.Y)
	}
	if hi/lo < 10 {
		// Less than a decade: a linear scale reads better.
		p.Y.Min, p.Y.Max = 0, hi*1.05
	} else {
		p.Y.Scale = plot.LogScale{}
		p.Y.Tick.Marker = logTicks125{}
		p.Y.Min, p.Y.Max = lo/1.2, hi*1.2
	}
	lr, err := plotter.NewLine(raw)
	if err != nil {
		return nil, err
	}
	lr.LineStyle = draw.LineStyle{Color: colLoss, Width: vg.Points(0.7)}
	mean, err := plotter.NewLine(movingMean(raw, window))
	if err != nil {
		return nil, err
	}
	mean.LineStyle = draw.LineStyle{Color: colLossMean, Width: vg.Points(1.6)}
	p.Add(lr, mean)
	p.Legend.Add("loss of each step", lr)
	p.Legend.Add(fmt.Sprintf("mean of the last %d steps", window), mean)
	return p, nil
}

// worldPanel plots the world size as a step function of the step, from the
// rounds (each holds from the step it continued from until the next round).
func worldPanel(steps []monitor.StepSeen, rounds []monitor.RoundSeen, xmax float64) (*plot.Plot, error) {
	p := plot.New()
	p.X.Label.Text = "global step"
	p.Y.Label.Text = "world size"
	p.X.Min, p.X.Max = 0, xmax
	p.Add(plotter.NewGrid())

	var ws plotter.XYs
	maxWS := 1
	for _, r := range rounds {
		ws = append(ws, plotter.XY{X: float64(r.Step), Y: float64(r.WorldSize)})
		maxWS = max(maxWS, r.WorldSize)
	}
	if len(ws) == 0 {
		// No round events (an old worker, or they were lost): fall back
		// to the world size each step reported.
		for _, s := range steps {
			ws = append(ws, plotter.XY{X: float64(s.Step), Y: float64(s.WorldSize)})
			maxWS = max(maxWS, s.WorldSize)
		}
	}
	ws = append(ws, plotter.XY{X: xmax, Y: ws[len(ws)-1].Y})
	p.Y.Min, p.Y.Max = 0, float64(maxWS)+1
	p.Y.Tick.Marker = integerTicks{}
	line, err := plotter.NewLine(ws)
	if err != nil {
		return nil, err
	}
	line.StepStyle = plotter.PostStep
	line.LineStyle = draw.LineStyle{Color: colWorld, Width: vg.Points(1.6)}
	p.Add(&roundMarks{rounds: rounds, labels: true}, line)
	return p, nil
}

// movingMean is the trailing mean of the last window points at each point.
func movingMean(xy plotter.XYs, window int) plotter.XYs {
	out := make(plotter.XYs, len(xy))
	var sum float64
	for i := range xy {
		sum += xy[i].Y
		if i >= window {
			sum -= xy[i-window].Y
		}
		out[i] = plotter.XY{X: xy[i].X, Y: sum / float64(min(i+1, window))}
	}
	return out
}

// alignX crops two vertically stacked canvases so that the data areas of
// a and b start and end at the same x, making their step axes line up.
func alignX(a *plot.Plot, ca draw.Canvas, b *plot.Plot, cb draw.Canvas) (draw.Canvas, draw.Canvas) {
	da, db := a.DataCanvas(ca), b.DataCanvas(cb)
	la, lb := da.Min.X-ca.Min.X, db.Min.X-cb.Min.X
	ra, rb := ca.Max.X-da.Max.X, cb.Max.X-db.Max.X
	left, right := max(la, lb), max(ra, rb)
	ca = draw.Crop(ca, left-la, -(right - ra), 0, 0)
	cb = draw.Crop(cb, left-lb, -(right - rb), 0, 0)
	return ca, cb
}

// roundMarks draws a dashed vertical line at the step each round after the
// first continued from; with labels, it writes the new world size beside
// it ("W=2"), moving a label down a line when it would overlap the last.
type roundMarks struct {
	rounds []monitor.RoundSeen
	labels bool
}

func markStyle(recovery bool) draw.LineStyle {
	c := colChange
	if recovery {
		c = colFailure
	}
	return draw.LineStyle{Color: c, Width: vg.Points(1.1), Dashes: []vg.Length{vg.Points(4), vg.Points(3)}}
}

// addLegend adds one legend entry per kind of mark present.
func (m *roundMarks) addLegend(p *plot.Plot) {
	var failure, change bool
	for _, r := range m.rounds[min(1, len(m.rounds)):] {
		failure = failure || r.Recovery
		change = change || !r.Recovery
	}
	if failure {
		p.Legend.Add("new round after a failure", legendMark{colFailure})
	}
	if change {
		p.Legend.Add("new round after a join or leave", legendMark{colChange})
	}
}

// Plot implements plot.Plotter.
func (m *roundMarks) Plot(c draw.Canvas, p *plot.Plot) {
	tx, _ := p.Transforms(&c)
	sty := p.Legend.TextStyle
	sty.Font.Size = vg.Points(10)
	sty.XAlign, sty.YAlign = draw.XLeft, draw.YBottom
	lineH := sty.Height("W=0") * 1.15
	level, lastRight := 0, vg.Length(math.Inf(-1))
	for i, r := range m.rounds {
		if i == 0 {
			continue
		}
		x := tx(float64(r.Step))
		if x < c.Min.X || x > c.Max.X {
			continue
		}
		ls := markStyle(r.Recovery)
		c.StrokeLine2(ls, x, c.Min.Y, x, c.Max.Y)
		if !m.labels {
			continue
		}
		txt := "W=" + strconv.Itoa(r.WorldSize)
		w := sty.Width(txt)
		tx0 := x + vg.Points(3)
		if tx0+w > c.Max.X { // keep it inside on the right edge
			tx0 = x - vg.Points(3) - w
		}
		if tx0 <= lastRight+vg.Points(2) {
			level++
		} else {
			level = 0
		}
		lastRight = max(lastRight, tx0+w)
		y := c.Min.Y + vg.Points(3) + vg.Length(level)*lineH
		ts := sty
		ts.Color = ls.Color
		c.FillText(ts, vg.Point{X: tx0, Y: y}, txt)
	}
}

// legendMark is the legend thumbnail of a round mark.
type legendMark struct{ c color.Color }

// Thumbnail implements plot.Thumbnailer.
func (l legendMark) Thumbnail(c *draw.Canvas) {
	ls := markStyle(l.c == colFailure)
	y := (c.Min.Y + c.Max.Y) / 2
	c.StrokeLine2(ls, c.Min.X, y, c.Max.X, y)
}

// unlabelled keeps a ticker's marks and drops their labels (the upper
// panel shares the lower one's step axis).
type unlabelled struct{ plot.Ticker }

func (u unlabelled) Ticks(lo, hi float64) []plot.Tick {
	t := u.Ticker.Ticks(lo, hi)
	for i := range t {
		t[i].Label = ""
	}
	return t
}

// logTicks125 marks 1..9 times each power of ten in range and labels the
// 1, 2 and 5 multiples, so a log axis spanning less than two decades
// still has several numbers on it.
type logTicks125 struct{}

func (logTicks125) Ticks(lo, hi float64) []plot.Tick {
	if !(lo > 0) || !(hi > lo) {
		return nil
	}
	var t []plot.Tick
	for k := int(math.Floor(math.Log10(lo))); k <= int(math.Ceil(math.Log10(hi))); k++ {
		for i := 1; i <= 9; i++ {
			v := float64(i) * math.Pow10(k)
			if v < lo || v > hi {
				continue
			}
			tk := plot.Tick{Value: v}
			if i == 1 || i == 2 || i == 5 {
				tk.Label = strconv.FormatFloat(v, 'f', max(0, -k), 64)
			}
			t = append(t, tk)
		}
	}
	return t
}

// integerTicks labels every whole number of a small range (world sizes),
// and about ten evenly spaced ones of a larger range.
type integerTicks struct{}

func (integerTicks) Ticks(lo, hi float64) []plot.Tick {
	first, last := int(math.Ceil(lo)), int(math.Floor(hi))
	stride := max(1, (last-first)/10)
	var t []plot.Tick
	for v := first; v <= last; v += stride {
		t = append(t, plot.Tick{Value: float64(v), Label: strconv.Itoa(v)})
	}
	return t
}
