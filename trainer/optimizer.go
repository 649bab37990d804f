package trainer

import "github.com/elastictrain/elastictrain/trainer/optim"

// The optimizers live in package trainer/optim; the names below are its
// own, kept here for one release.

// Optimizer applies one update to the parameters from their averaged
// gradients.
//
// Deprecated: use optim.Optimizer, the same type.
type Optimizer = optim.Optimizer

// SGD is plain stochastic gradient descent with optional L2 weight decay.
//
// Deprecated: use optim.SGD, the same type.
type SGD = optim.SGD

// NewSGD returns an SGD optimizer with learning rate lr.
//
// Deprecated: use optim.NewSGD.
func NewSGD(lr float64) *SGD { return optim.NewSGD(lr) }

// Momentum is SGD with heavy-ball (or Nesterov) momentum.
//
// Deprecated: use optim.Momentum, the same type.
type Momentum = optim.Momentum

// NewMomentum returns a Momentum optimizer with learning rate lr and
// coefficient mu.
//
// Deprecated: use optim.NewMomentum.
func NewMomentum(lr, mu float64) *Momentum { return optim.NewMomentum(lr, mu) }

// Adam is the adaptive moment estimation optimizer of Kingma & Ba.
//
// Deprecated: use optim.Adam, the same type.
type Adam = optim.Adam

// NewAdam returns an Adam optimizer with learning rate lr and the paper's
// default betas and epsilon.
//
// Deprecated: use optim.NewAdam.
func NewAdam(lr float64) *Adam { return optim.NewAdam(lr) }
