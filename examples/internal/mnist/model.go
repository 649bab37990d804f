package mnist

import (
	"context"
	"errors"
	"fmt"
	"math"
	"math/rand/v2"

	"gorgonia.org/gorgonia"
	"gorgonia.org/tensor"

	"github.com/elastictrain/elastictrain/trainer"
	"github.com/elastictrain/elastictrain/trainer/gorgoniastep"
	"github.com/elastictrain/elastictrain/trainer/gorgoniastep/cpuops"
)

// ErrBadInput reports a batch whose pixels, labels or size do not fit.
var ErrBadInput = errors.New("mnist: bad model input")

// Model is a gorgonia classifier of MNIST digits, trained through the
// elastictrain trainer: its Params alias the gorgonia tensors, and Step is
// the body of the trainer.StepFunc. It compiles one graph per batch size
// (see gorgoniastep.Model), so any share of a global batch works.
//
// Not safe for concurrent use.
type Model struct {
	kind   string
	gm     *gorgoniastep.Model
	bounds []int // StepMicro's micro-batch bounds, reused
}

// maxGraphs is how many batch sizes' graphs a Model keeps compiled.
const maxGraphs = 16

// ModelKinds lists the names NewModel accepts.
var ModelKinds = []string{"mlp", "cnn"}

// NewModel builds the model named kind and initialises its parameters
// deterministically from seed:
//
//   - "mlp": 784 -> 256 (ReLU) -> 10, 203 530 parameters.
//   - "cnn": conv 5x5x8 (pad 2, ReLU, 2x2 max-pool) -> conv 5x5x16 (pad 2,
//     ReLU, 2x2 max-pool) -> 784 -> 10; the convolutions have no bias;
//     11 274 parameters.
//
// Weights are drawn uniformly from ±sqrt(6/fan_in) (He et al., 2015,
// uniform form), biases start at zero. The random numbers come from PCG
// (math/rand/v2, seeded with seed) through Uint64 only, whose output Go
// specifies, so the initial parameters are the same bits on every platform
// and Go version. The loss is softmax cross-entropy summed over the batch.
// Errors: ErrBadInput for an unknown kind, gorgoniastep errors.
func NewModel(kind string, seed int64) (*Model, error) {
	var specs []gorgoniastep.ParamSpec
	var build gorgoniastep.BuildFunc
	switch kind {
	case "mlp":
		specs = []gorgoniastep.ParamSpec{
			{Name: "fc1.w", Shape: []int{Pixels, 256}},
			{Name: "fc1.b", Shape: []int{256}},
			{Name: "fc2.w", Shape: []int{256, NumClasses}},
			{Name: "fc2.b", Shape: []int{NumClasses}},
		}
		build = buildMLP
	case "cnn":
		specs = []gorgoniastep.ParamSpec{
			{Name: "conv1.w", Shape: []int{8, 1, 5, 5}},
			{Name: "conv2.w", Shape: []int{16, 8, 5, 5}},
			{Name: "fc.w", Shape: []int{16 * 7 * 7, NumClasses}},
			{Name: "fc.b", Shape: []int{NumClasses}},
		}
		build = buildCNN
	default:
		return nil, fmt.Errorf("%w: unknown model %q, want one of %v", ErrBadInput, kind, ModelKinds)
	}
	// A graph per share size a balanced worker is given, kept compiled
	// (its share moves when the workers' speeds change).
	gm, err := gorgoniastep.New(specs, build, gorgoniastep.WithMaxGraphs(maxGraphs))
	if err != nil {
		return nil, err
	}
	initParams(gm.Params(), uint64(seed))
	return &Model{kind: kind, gm: gm}, nil
}

// initParams fills weights (tensors of 2 or more dimensions) uniformly in
// ±sqrt(6/fan_in) and sets biases to zero. fan_in is the product of all
// dimensions but the output one: the first for convolution filters
// (out, in, kh, kw), the last for dense weights (in, out).
func initParams(ps []trainer.Param, seed uint64) {
	r := rand.New(rand.NewPCG(seed, 0x6d6e697374)) // "mnist"
	for _, p := range ps {
		if len(p.Shape) < 2 {
			clear(p.Value)
			continue
		}
		fanIn := len(p.Value) / p.Shape[len(p.Shape)-1]
		if len(p.Shape) == 4 {
			fanIn = len(p.Value) / p.Shape[0]
		}
		limit := math.Sqrt(6 / float64(fanIn))
		for i := range p.Value {
			u := float64(r.Uint64()>>11) / (1 << 53) // [0, 1)
			p.Value[i] = float32((2*u - 1) * limit)
		}
	}
}

// Kind returns "mlp" or "cnn".
func (m *Model) Kind() string { return m.kind }

// Params returns the model's parameters; Value and Grad alias gorgonia's
// tensors (see gorgoniastep).
func (m *Model) Params() []trainer.Param { return m.gm.Params() }

// Step runs forward and backward on n = len(labels) samples: pixels holds
// n*Pixels values in [0, 1] (row-major images, one after another), labels
// the digits. Afterwards every Param.Grad holds the SUM over the samples of
// the gradient of the per-sample softmax cross-entropy, and Step returns the
// summed loss (the trainer.StepFunc contract). With no samples it zeroes the
// gradients and returns 0. Errors: ErrBadInput (sizes or labels out of
// range), ctx errors, gorgoniastep errors.
func (m *Model) Step(ctx context.Context, pixels []float32, labels []int) (float64, error) {
	n := len(labels)
	if err := checkBatch(pixels, n); err != nil {
		return 0, err
	}
	for i, l := range labels {
		if l < 0 || l >= NumClasses {
			return 0, fmt.Errorf("%w: label %d of sample %d, want 0..%d", ErrBadInput, l, i, NumClasses-1)
		}
	}
	return m.gm.Step(ctx, n, func(mc *gorgoniastep.Machine) error {
		normalize(mc.Input(0), pixels)
		oneHot := mc.Input(1)
		clear(oneHot)
		for i, l := range labels {
			oneHot[i*NumClasses+l] = 1
		}
		return nil
	})
}

// StepMicro is Step on K = len(labels) micro-batches at once, for the
// trainer's deterministic mode (trainer.MicroStepFunc): pixels[k] and
// labels[k] are micro-batch k's. Afterwards grads[k] (k < K-1) holds
// micro-batch k's gradient sums, the Params' Grad buffers the last one's,
// and losses[k] its loss sum, each the same bits as Step on that
// micro-batch alone; the forward and backward pass run once over all the
// samples (see gorgoniastep.Model.StepMicro). Errors as for Step.
func (m *Model) StepMicro(ctx context.Context, pixels [][]float32, labels [][]int, grads [][][]float32, losses []float64) error {
	if len(pixels) != len(labels) || len(labels) == 0 {
		return fmt.Errorf("%w: %d pixel sets for %d label sets", ErrBadInput, len(pixels), len(labels))
	}
	m.bounds = append(m.bounds[:0], 0)
	for k, l := range labels {
		if err := checkBatch(pixels[k], len(l)); err != nil {
			return fmt.Errorf("micro-batch %d: %w", k, err)
		}
		for i, y := range l {
			if y < 0 || y >= NumClasses {
				return fmt.Errorf("%w: label %d of sample %d of micro-batch %d, want 0..%d", ErrBadInput, y, i, k, NumClasses-1)
			}
		}
		m.bounds = append(m.bounds, m.bounds[k]+len(l))
	}
	return m.gm.StepMicro(ctx, m.bounds, func(mc *gorgoniastep.Machine, lo, hi int) error {
		x, oneHot := mc.Input(0), mc.Input(1)
		clear(oneHot)
		row := 0
		for k := lo; k < hi; k++ {
			normalize(x[row*Pixels:], pixels[k])
			for i, l := range labels[k] {
				oneHot[(row+i)*NumClasses+l] = 1
			}
			row += len(labels[k])
		}
		return nil
	}, grads, losses)
}

// Predict returns the most likely digit for each of the n images in pixels
// (n*Pixels values), from a forward pass that leaves the gradients alone.
// Ties go to the lower digit. Errors: ErrBadInput, gorgoniastep errors.
func (m *Model) Predict(pixels []float32, n int) ([]int, error) {
	logits, err := m.Logits(pixels, n)
	if err != nil {
		return nil, err
	}
	pred := make([]int, n)
	for i := range pred {
		row := logits[i*NumClasses : (i+1)*NumClasses]
		best := 0
		for c, v := range row {
			if v > row[best] {
				best = c
			}
		}
		pred[i] = best
	}
	return pred, nil
}

// Logits returns the n x NumClasses logits (row-major) of the n images in
// pixels, in a new slice. Errors as for Predict.
func (m *Model) Logits(pixels []float32, n int) ([]float32, error) {
	if err := checkBatch(pixels, n); err != nil {
		return nil, err
	}
	if n == 0 {
		return nil, nil
	}
	mc, err := m.gm.Eval(n)
	if err != nil {
		return nil, err
	}
	normalize(mc.Input(0), pixels)
	clear(mc.Input(1)) // labels only feed the loss, which Predict ignores
	if _, err := mc.Run(context.Background()); err != nil {
		return nil, err
	}
	out, err := mc.Output(0)
	if err != nil {
		return nil, err
	}
	return append([]float32(nil), out...), nil
}

// The mean and standard deviation of the MNIST training pixels (in [0, 1]).
const pixelMean, pixelStd = 0.1307, 0.3081

// normalize writes (src - pixelMean) / pixelStd into dst: zero-mean,
// unit-variance inputs train faster.
func normalize(dst, src []float32) {
	for i, v := range src {
		dst[i] = (v - pixelMean) * (1 / pixelStd)
	}
}

func checkBatch(pixels []float32, n int) error {
	if n < 0 || len(pixels) != n*Pixels {
		return fmt.Errorf("%w: %d pixel values for %d images of %d pixels", ErrBadInput, len(pixels), n, Pixels)
	}
	return nil
}

// Close releases the compiled graphs.
func (m *Model) Close() error { return m.gm.Close() }

// softmaxXent returns the summed softmax cross-entropy of logits (batch,
// classes) against the one-hot matrix y: -sum(y * logsoftmax(logits)), in
// one op of package cpuops (gorgonia's LogSoftMax, HadamardProd, Sum and
// Neg, and their gradients, in two).
func softmaxXent(logits, y *gorgonia.Node) (*gorgonia.Node, error) {
	return cpuops.SoftmaxCrossEntropy(logits, y)
}

// denseLayer returns x·w + b (cpuops.Dense: gorgonia's Mul and
// BroadcastAdd in one op, whose gradients need no transposed copies).
func denseLayer(x, w, b *gorgonia.Node) (*gorgonia.Node, error) {
	return cpuops.Dense(x, w, b)
}

// inputs adds the two input nodes: images (batch, Pixels) and one-hot
// labels (batch, NumClasses).
func inputs(g *gorgonia.ExprGraph, batch int) (x, y *gorgonia.Node) {
	x = gorgonia.NewMatrix(g, tensor.Float32, gorgonia.WithShape(batch, Pixels), gorgonia.WithName("pixels"))
	y = gorgonia.NewMatrix(g, tensor.Float32, gorgonia.WithShape(batch, NumClasses), gorgonia.WithName("onehot"))
	return x, y
}

func buildMLP(g *gorgonia.ExprGraph, batch int, p gorgonia.Nodes) (gorgoniastep.Graph, error) {
	x, y := inputs(g, batch)
	h, err := denseLayer(x, p[0], p[1])
	if err != nil {
		return gorgoniastep.Graph{}, err
	}
	if h, err = cpuops.ReLU(h); err != nil {
		return gorgoniastep.Graph{}, err
	}
	logits, err := denseLayer(h, p[2], p[3])
	if err != nil {
		return gorgoniastep.Graph{}, err
	}
	loss, err := softmaxXent(logits, y)
	if err != nil {
		return gorgoniastep.Graph{}, err
	}
	return gorgoniastep.Graph{Loss: loss, Inputs: gorgonia.Nodes{x, y}, Outputs: gorgonia.Nodes{logits}}, nil
}

// convBlock returns maxpool2x2(relu(conv5x5(x, w))) with padding 2, from
// the ops of package cpuops: the same function as gorgonia's Conv2d,
// Rectify and MaxPool2D, several times faster, and allocating nothing per
// step.
func convBlock(x, w *gorgonia.Node) (*gorgonia.Node, error) {
	c, err := cpuops.Conv2D(x, w, 2, 2)
	if err != nil {
		return nil, err
	}
	return cpuops.ReLUMaxPool2D(c, 2, 2)
}

func buildCNN(g *gorgonia.ExprGraph, batch int, p gorgonia.Nodes) (gorgoniastep.Graph, error) {
	x, y := inputs(g, batch)
	im, err := gorgonia.Reshape(x, tensor.Shape{batch, 1, ImageRows, ImageCols})
	if err != nil {
		return gorgoniastep.Graph{}, err
	}
	h, err := convBlock(im, p[0]) // (batch, 8, 14, 14)
	if err != nil {
		return gorgoniastep.Graph{}, err
	}
	if h, err = convBlock(h, p[1]); err != nil { // (batch, 16, 7, 7)
		return gorgoniastep.Graph{}, err
	}
	if h, err = gorgonia.Reshape(h, tensor.Shape{batch, 16 * 7 * 7}); err != nil {
		return gorgoniastep.Graph{}, err
	}
	logits, err := denseLayer(h, p[2], p[3])
	if err != nil {
		return gorgoniastep.Graph{}, err
	}
	loss, err := softmaxXent(logits, y)
	if err != nil {
		return gorgoniastep.Graph{}, err
	}
	return gorgoniastep.Graph{Loss: loss, Inputs: gorgonia.Nodes{x, y}, Outputs: gorgonia.Nodes{logits}}, nil
}
