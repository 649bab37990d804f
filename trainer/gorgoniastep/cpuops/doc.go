// Package cpuops provides gorgonia ops for convolutional and dense
// networks on the CPU that are faster than gorgonia's own and allocate
// nothing per run: [Conv2D] (stride-1 2-D convolution, NCHW, float32),
// [ReLUMaxPool2D] (ReLU and non-overlapping max-pooling in one pass),
// [Dense] (x·w + b), [ReLU] and [SoftmaxCrossEntropy] (summed over the
// batch), each with its gradient ops for gorgonia.Grad.
//
// # How
//
// Conv2D multiplies the filters with each image's patches (the im2col
// formulation, Chellapilla et al., "High Performance Convolutional Neural
// Networks for Document Processing", 2006) without copying them into a
// patch matrix: it zero-pads the image into a buffer the node keeps, where
// every patch row, read over the padded width, is a contiguous run, and
// one matrix product over those runs in place (gemm.NNRows) gives the
// output on the padded width, whose extra columns it drops. The filter
// gradient is the sum over images of the output gradient (widened by zero
// columns) times the patch rows transposed; the input gradient is itself a
// stride-1 convolution of the output gradient with the filters flipped
// and their channel axes swapped, computed the same way. The products run
// on AVX kernels on amd64 (portable Go elsewhere, or with the purego build
// tag); see package internal/gemm for their summation order.
//
// gorgonia.Conv2d, for comparison, lowers the whole batch at once into a
// fresh matrix every run, multiplies, transposes the result into NCHW, and
// its gradient goes through col2im and further transposes: 51 MB
// allocated per step of the MNIST example's CNN at batch 64.
//
// Dense multiplies in place too: its weight gradient xᵀ·dy reads x with
// swapped strides and its input gradient dy·wᵀ takes dot products of rows,
// where gorgonia's Mul copies the transposed operand first.
//
// # Buffers
//
// Each node owns its output tensor and scratch space, allocated on its
// first run and returned by every later run. gorgonia's tape machine may
// use a dead value's memory for a later node in the same run; that is
// safe here, because every run recomputes the whole output. Do not keep a
// node's value across runs: the next run overwrites it.
//
// # Determinism
//
// Every output element is computed in a fixed order that depends on the
// shapes only: the same bits on every run, whatever GOMAXPROCS, on every
// CPU (the AVX and the portable kernels agree bit for bit; neither uses
// fused multiply-add). The results differ in the last bits from
// gorgonia's ops, which sum in another order.
//
// # Concurrency
//
// An op belongs to one node of one graph; like gorgonia's tape machine, it
// is not safe for concurrent runs.
package cpuops
