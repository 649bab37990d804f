package optim

import (
	"encoding/binary"
	"fmt"
	"math"

	"github.com/elastictrain/elastictrain/trainer/internal/enc"
	"github.com/elastictrain/elastictrain/trainer/internal/optk"
)

// SGD is plain stochastic gradient descent with optional L2 weight decay:
// v -= lr * (g + wd*v). Not safe for concurrent use.
type SGD struct {
	// LR is the learning rate.
	LR float64
	// WeightDecay is the L2 penalty coefficient; 0 disables it.
	WeightDecay float64
}

// NewSGD returns an SGD optimizer with learning rate lr.
func NewSGD(lr float64) *SGD { return &SGD{LR: lr} }

// Name implements Optimizer.
func (o *SGD) Name() string { return "sgd" }

// LearningRate implements Optimizer.
func (o *SGD) LearningRate() float64 { return o.LR }

// SetLearningRate implements Optimizer.
func (o *SGD) SetLearningRate(lr float64) { o.LR = lr }

// Step implements Optimizer.
func (o *SGD) Step(params []Param) error {
	lr, wd := float32(o.LR), float32(o.WeightDecay)
	for _, p := range params {
		v, g := p.Value, p.Grad[:len(p.Value)]
		for i := range v {
			v[i] -= lr * (g[i] + wd*v[i])
		}
	}
	return nil
}

// AppendState implements Optimizer: the learning rate and weight decay.
func (o *SGD) AppendState(dst []byte) []byte {
	dst = enc.AppendF64(dst, o.LR)
	return enc.AppendF64(dst, o.WeightDecay)
}

// LoadState implements Optimizer.
func (o *SGD) LoadState(src []byte, params []Param) error {
	r := enc.Reader{B: src}
	lr, wd := r.F64(), r.F64()
	if err := r.Done(); err != nil {
		return fmt.Errorf("%w: sgd: %v", ErrCorruptState, err)
	}
	o.LR, o.WeightDecay = lr, wd
	return nil
}

// Momentum is SGD with heavy-ball momentum (Polyak 1964), optionally in the
// Nesterov form (Sutskever et al. 2013): u = mu*u + g; v -= lr*u (or
// v -= lr*(g + mu*u) with Nesterov). Not safe for concurrent use.
type Momentum struct {
	// LR is the learning rate.
	LR float64
	// Mu is the momentum coefficient, typically 0.9.
	Mu float64
	// Nesterov selects Nesterov's accelerated form.
	Nesterov bool
	u        [][]float32
}

// NewMomentum returns a Momentum optimizer with learning rate lr and
// coefficient mu.
func NewMomentum(lr, mu float64) *Momentum { return &Momentum{LR: lr, Mu: mu} }

// Name implements Optimizer.
func (o *Momentum) Name() string { return "momentum" }

// LearningRate implements Optimizer.
func (o *Momentum) LearningRate() float64 { return o.LR }

// SetLearningRate implements Optimizer.
func (o *Momentum) SetLearningRate(lr float64) { o.LR = lr }

// Step implements Optimizer.
func (o *Momentum) Step(params []Param) error {
	if o.u == nil {
		o.u = zerosLike(params)
	}
	if err := sameShapes(o.u, params); err != nil {
		return err
	}
	lr, mu := float32(o.LR), float32(o.Mu)
	for k, p := range params {
		v, g, u := p.Value, p.Grad[:len(p.Value)], o.u[k][:len(p.Value)]
		for i := range v {
			u[i] = mu*u[i] + g[i]
			if o.Nesterov {
				v[i] -= lr * (g[i] + mu*u[i])
			} else {
				v[i] -= lr * u[i]
			}
		}
	}
	return nil
}

// AppendState implements Optimizer: learning rate, mu, Nesterov flag and the
// velocity of every parameter.
func (o *Momentum) AppendState(dst []byte) []byte {
	dst = enc.AppendF64(dst, o.LR)
	dst = enc.AppendF64(dst, o.Mu)
	dst = enc.AppendBool(dst, o.Nesterov)
	return enc.AppendTensors(dst, o.u)
}

// LoadState implements Optimizer.
func (o *Momentum) LoadState(src []byte, params []Param) error {
	r := enc.Reader{B: src}
	lr, mu, nest := r.F64(), r.F64(), r.Bool()
	u := readTensors(&r, params)
	if err := r.Done(); err != nil {
		return fmt.Errorf("%w: momentum: %v", ErrCorruptState, err)
	}
	o.LR, o.Mu, o.Nesterov, o.u = lr, mu, nest, u
	return nil
}

// Adam is the adaptive moment estimation optimizer of Kingma & Ba, "Adam: A
// Method for Stochastic Optimization", ICLR 2015, with bias correction.
// It is a ScaledStepper and a StateFreezer. Not safe for concurrent use.
type Adam struct {
	// LR is the learning rate (step size alpha), typically 1e-3.
	LR float64
	// Beta1 and Beta2 are the decay rates of the first and second moment
	// estimates; defaults 0.9 and 0.999.
	Beta1, Beta2 float64
	// Eps is added to the denominator for numerical stability; default 1e-8.
	Eps  float64
	t    int64
	m, v [][]float32 // the current moment estimates
	// frozen: m and v are held by a commit (FreezeState), so the next Step
	// writes the new estimates into spareM and spareV (or new buffers)
	// and leaves them unchanged.
	frozen         bool
	spareM, spareV [][]float32
}

// NewAdam returns an Adam optimizer with learning rate lr and the paper's
// default betas and epsilon.
func NewAdam(lr float64) *Adam { return &Adam{LR: lr, Beta1: 0.9, Beta2: 0.999, Eps: 1e-8} }

// Name implements Optimizer.
func (o *Adam) Name() string { return "adam" }

// LearningRate implements Optimizer.
func (o *Adam) LearningRate() float64 { return o.LR }

// SetLearningRate implements Optimizer.
func (o *Adam) SetLearningRate(lr float64) { o.LR = lr }

// Steps returns how many updates Adam has applied (its t).
func (o *Adam) Steps() int64 { return o.t }

// Step implements Optimizer.
func (o *Adam) Step(params []Param) error { return o.step(params, 1, false) }

// StepScaled implements ScaledStepper: Step with every gradient first
// multiplied by scale (and left so in Param.Grad), in the same pass.
func (o *Adam) StepScaled(params []Param, scale float32) error { return o.step(params, scale, true) }

func (o *Adam) step(params []Param, scale float32, scaled bool) error {
	if o.m == nil || o.v == nil {
		o.m, o.v, o.frozen = zerosLike(params), zerosLike(params), false
	}
	if err := sameShapes(o.m, params); err != nil {
		return err
	}
	if err := sameShapes(o.v, params); err != nil {
		return err
	}
	dstM, dstV := o.m, o.v
	if o.frozen {
		// A commit holds the current estimates: the new ones go elsewhere.
		if sameShapes(o.spareM, params) != nil || sameShapes(o.spareV, params) != nil {
			o.spareM, o.spareV = zerosLike(params), zerosLike(params)
		}
		dstM, dstV = o.spareM, o.spareV
		o.spareM, o.spareV = nil, nil
	}
	o.t++
	b1, b2 := o.Beta1, o.Beta2
	// Fold the bias corrections into the step size (the paper's efficient form).
	c := optk.AdamCoeffs{
		GScale:    scale,
		B1:        float32(b1),
		B2:        float32(b2),
		Alpha:     float32(o.LR * math.Sqrt(1-math.Pow(b2, float64(o.t))) / (1 - math.Pow(b1, float64(o.t)))),
		Eps:       float32(o.Eps),
		StoreGrad: scaled,
	}
	c.C1, c.C2 = 1-c.B1, 1-c.B2
	for k, p := range params {
		n := len(p.Value)
		optk.Adam(p.Value, p.Grad[:n], o.m[k][:n], o.v[k][:n], dstM[k][:n], dstV[k][:n], &c)
		if scaled {
			for i := n; i < len(p.Grad); i++ {
				p.Grad[i] *= scale
			}
		}
	}
	o.m, o.v, o.frozen = dstM, dstV, false
	return nil
}

// FreezeState implements StateFreezer. The current moment estimates become
// the frozen state's (no copy) unless an earlier frozen state still holds
// them (no Step since), in which case they are copied; reuse's buffers
// become the next Step's.
func (o *Adam) FreezeState(reuse FrozenState) FrozenState {
	f, _ := reuse.(*adamFrozen)
	var oldM, oldV [][]float32
	if f == nil || f.owner != o {
		f = &adamFrozen{owner: o}
	} else {
		oldM, oldV = f.m, f.v
	}
	f.lr, f.b1, f.b2, f.eps, f.t = o.LR, o.Beta1, o.Beta2, o.Eps, o.t
	switch {
	case o.m == nil || o.v == nil:
		f.m, f.v = nil, nil
	case sameTensors(oldM, o.m):
		// reuse is the frozen state that holds the current estimates
		// (retaken with no Step since): it keeps them.
		f.m, f.v = oldM, oldV
		return f
	case o.frozen:
		// Another frozen state holds them: this one gets a copy.
		if !sameLens(oldM, o.m) || !sameLens(oldV, o.v) {
			oldM, oldV = make([][]float32, len(o.m)), make([][]float32, len(o.v))
			for i := range o.m {
				oldM[i], oldV[i] = make([]float32, len(o.m[i])), make([]float32, len(o.v[i]))
			}
		}
		for i := range o.m {
			copy(oldM[i], o.m[i])
			copy(oldV[i], o.v[i])
		}
		f.m, f.v = oldM, oldV
		return f
	default:
		f.m, f.v, o.frozen = o.m, o.v, true
	}
	if oldM != nil && oldV != nil {
		o.spareM, o.spareV = oldM, oldV
	}
	return f
}

// adamFrozen is an Adam state held by a commit: never written while a
// snapshot holds it; its buffers go back to the optimizer (as the next
// Step's output) when the snapshot is retaken.
type adamFrozen struct {
	owner           *Adam
	lr, b1, b2, eps float64
	t               int64
	m, v            [][]float32
}

// AppendState implements FrozenState: Adam.AppendState's encoding.
func (f *adamFrozen) AppendState(dst []byte) []byte {
	return appendAdamState(dst, f.lr, f.b1, f.b2, f.eps, f.t, f.m, f.v)
}

// sameTensors reports whether a and b are the same list of buffers.
func sameTensors(a, b [][]float32) bool {
	return len(a) > 0 && len(a) == len(b) && &a[0] == &b[0]
}

// sameLens reports whether a and b hold as many tensors of the same lengths.
func sameLens(a, b [][]float32) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if len(a[i]) != len(b[i]) {
			return false
		}
	}
	return true
}

// AppendState implements Optimizer: hyper-parameters, step count t and both
// moment estimates of every parameter.
func (o *Adam) AppendState(dst []byte) []byte {
	return appendAdamState(dst, o.LR, o.Beta1, o.Beta2, o.Eps, o.t, o.m, o.v)
}

func appendAdamState(dst []byte, lr, b1, b2, eps float64, t int64, m, v [][]float32) []byte {
	dst = enc.AppendF64(dst, lr)
	dst = enc.AppendF64(dst, b1)
	dst = enc.AppendF64(dst, b2)
	dst = enc.AppendF64(dst, eps)
	dst = binary.LittleEndian.AppendUint64(dst, uint64(t))
	dst = enc.AppendTensors(dst, m)
	return enc.AppendTensors(dst, v)
}

// LoadState implements Optimizer.
func (o *Adam) LoadState(src []byte, params []Param) error {
	r := enc.Reader{B: src}
	lr, b1, b2, eps := r.F64(), r.F64(), r.F64(), r.F64()
	t := int64(r.U64())
	m := readTensors(&r, params)
	v := readTensors(&r, params)
	if err := r.Done(); err != nil {
		return fmt.Errorf("%w: adam: %v", ErrCorruptState, err)
	}
	if (m == nil) != (v == nil) {
		return fmt.Errorf("%w: adam: one moment estimate present without the other", ErrCorruptState)
	}
	if t < 0 {
		return fmt.Errorf("%w: adam: negative step count %d", ErrCorruptState, t)
	}
	o.LR, o.Beta1, o.Beta2, o.Eps, o.t, o.m, o.v, o.frozen = lr, b1, b2, eps, t, m, v, false
	return nil
}

func zerosLike(params []Param) [][]float32 {
	out := make([][]float32, len(params))
	for i, p := range params {
		out[i] = make([]float32, len(p.Value))
	}
	return out
}

func sameShapes(state [][]float32, params []Param) error {
	if len(state) != len(params) {
		return fmt.Errorf("%w: optimizer state has %d tensors, model has %d", ErrShapeMismatch, len(state), len(params))
	}
	for i, p := range params {
		if len(state[i]) != len(p.Value) || len(p.Grad) < len(p.Value) {
			return fmt.Errorf("%w: parameter %q has %d values and %d grads, optimizer state %d",
				ErrShapeMismatch, p.Name, len(p.Value), len(p.Grad), len(state[i]))
		}
	}
	return nil
}

// readTensors reads a state tensor list that must match params.
func readTensors(r *enc.Reader, params []Param) [][]float32 {
	return r.Tensors(len(params), func(i int) int { return len(params[i].Value) })
}

// The trainer finds Adam's capabilities by type assertion: a signature that
// drifted would lose them silently, so the compiler checks them here.
var (
	_ Optimizer     = (*SGD)(nil)
	_ Optimizer     = (*Momentum)(nil)
	_ Optimizer     = (*Adam)(nil)
	_ ScaledStepper = (*Adam)(nil)
	_ StateFreezer  = (*Adam)(nil)
	_ FrozenState   = (*adamFrozen)(nil)
)
