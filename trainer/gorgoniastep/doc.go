// Package gorgoniastep adapts a gorgonia (gorgonia.org/gorgonia) model to
// the elastictrain trainer: it shares the model's parameter and gradient
// tensors with the trainer as []trainer.Param without copying, and runs
// gorgonia's tape machine as the forward and backward pass of a
// trainer.StepFunc. The core packages (elastic, sync, dataloader, trainer)
// never import gorgonia; this package and the examples do.
//
// # Two levels
//
// [Bind] compiles one graph of fixed shapes that the caller built, with its
// learnables, into a [Machine]. [New] owns the parameter buffers and a
// [BuildFunc], and compiles one graph per batch size on demand, all of
// them bound to the same buffers: a [Model]. Use a Model in a StepFunc,
// because a rank's share of a global batch varies (uneven splits, the last
// batch of an epoch, rescaling).
//
// # Sharing the arrays
//
// Each learnable is a float32 tensor whose backing array is the Param's
// Value; its gradient tensor (gorgonia's dual value, bound with
// gorgonia.WithGrad) has the Param's Grad as backing array. After every
// run [Machine.Run] copies each gradient node's value into that array (one
// pass; gorgonia's BindDualValues would zero it and add the gradient in,
// two passes, with a scalar add) and checks that both arrays are still the
// ones shared (ErrAliasBroken otherwise), so the trainer can read Grad and
// write Value directly.
//
// # Gradient contract
//
// After a run each Param.Grad holds the gradient of the loss node. For a
// trainer.StepFunc the loss must be the SUM over the batch of per-sample
// losses, and then Grad is the sum of per-sample gradients as the trainer
// requires. A graph whose loss is a mean can use [WithMeanLoss] (Model) or
// [WithLossScale] (Bind). [Model.Step] with zero samples zeroes the
// gradients and returns 0 without running anything.
//
// # Determinism
//
// For a fixed batch and fixed parameter values a run is bit-for-bit
// reproducible with the ops used by the tests and the MNIST example (matrix
// multiply, broadcast add, tanh, ReLU, log-softmax, sum, gorgonia's
// 2-D convolution and max-pooling, and the ops of package cpuops): each
// output element is always summed in the same order, decided by the shapes
// alone, not by GOMAXPROCS (gonum's matrix multiply splits work across
// goroutines above 64x64 blocks, but not a sum). Different batch sizes are
// different graphs and round differently.
//
// Which matrix kernels: cpuops multiplies with this module's own kernels
// (AVX assembly on amd64, portable Go elsewhere or with -tags purego),
// which give the same bits on every CPU. Built with -tags openblas, its
// Dense layers call OpenBLAS instead (cgo, -lopenblas; the convolutions
// keep this module's kernels), whose bits depend on the library build, the
// CPU kind it detects at run time and its thread count (one unless
// OPENBLAS_NUM_THREADS says otherwise). So bit-identical
// training across processes (trainer.Config.Deterministic) holds with the
// default build everywhere, and with OpenBLAS only between workers that
// load the same libopenblas on the same kind of CPU with the same
// OPENBLAS_NUM_THREADS. gorgonia's own ops (gorgonia.Mul) use gorgonia's
// BLAS: gonum's pure Go unless the program calls gorgonia.Use.
//
// # Costs and threads
//
// Building and compiling a graph takes a few milliseconds for the MNIST
// example's MLP and about 40 ms for its CNN (2 cores). A training Machine
// compiles only what the loss, the learnables' gradients and the outputs
// need: the gradients gorgonia's symbolic differentiation also builds for
// the inputs (the pixels, the labels) are left out. Each run allocates
// the intermediate tensors of gorgonia's own ops afresh (the tape machine
// drops its registers on Reset: 1.4 MB per run for the example's MLP at
// batch 64 built from gorgonia's Mul, BroadcastAdd, Rectify and
// LogSoftMax, 51 MB for its CNN with gorgonia's Conv2d and MaxPool2D).
// The ops of package cpuops keep their buffers across runs instead: built
// from them, both models allocate about 4 KB per run. A run locks the calling
// goroutine to its OS thread and starts one goroutine that ends before Run
// returns; gonum's matrix multiply may use up to GOMAXPROCS goroutines.
//
// # Concurrency
//
// Neither Machine nor Model is safe for concurrent use; the trainer calls
// them from its loop goroutine.
package gorgoniastep
