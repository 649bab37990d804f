package main

import "math"

// The parameter server's tables (Config.Tables of the partition).
const (
	tableUsers = 0
	tableItems = 1
)

// Model is the click-through model: a user embedding U[u] and an item
// embedding V[i] of Dim values each (sparse, on the parameter server, with
// Adagrad), a dense weight per dimension W and a bias C (allreduced, with
// Adam), trained with the logistic loss:
//
//	logit(u, i) = sum_k W[k] * U[u][k] * V[i][k] + C
type Model struct {
	Dim   int
	Dense []float32 // W (Dim values) then C
	Grad  []float32 // gradient of Dense
}

// NewModel returns a model of dimension dim with W = 1 and C = 0.
func NewModel(dim int) *Model {
	m := &Model{Dim: dim, Dense: make([]float32, dim+1), Grad: make([]float32, dim+1)}
	for k := range dim {
		m.Dense[k] = 1
	}
	return m
}

// Lookup holds one row of each table per sample of a batch (a row used by
// several samples is pulled several times, and the shards sum its pushed
// gradients): the pulled embeddings and, after Backward, their gradients.
type Lookup struct {
	Users, Items []int64   // row IDs, by sample
	UVals, IVals []float32 // pulled rows, Dim values per sample
	UGrad, IGrad []float32 // gradients of the summed loss, likewise
}

// Prepare sizes l for samples.
func (l *Lookup) Prepare(samples []Sample, dim int) {
	l.Users, l.Items = l.Users[:0], l.Items[:0]
	for _, s := range samples {
		l.Users, l.Items = append(l.Users, int64(s.User)), append(l.Items, int64(s.Item))
	}
	n := len(samples) * dim
	l.UVals, l.IVals, l.UGrad, l.IGrad = make([]float32, n), make([]float32, n), make([]float32, n), make([]float32, n)
}

// Logit returns the model's logit for embeddings u and v.
func (m *Model) Logit(u, v []float32) float64 {
	z := float64(m.Dense[m.Dim])
	for k := range m.Dim {
		z += float64(m.Dense[k]) * float64(u[k]) * float64(v[k])
	}
	return z
}

// Backward runs forward and backward over samples with the pulled rows in
// l. It returns the SUM of the per-sample logistic losses and leaves the
// SUM of the per-sample gradients in l.UGrad, l.IGrad and m.Grad.
func (m *Model) Backward(samples []Sample, l *Lookup) float64 {
	d := m.Dim
	clear(m.Grad)
	loss := 0.0
	for n, s := range samples {
		u, v := l.UVals[n*d:(n+1)*d], l.IVals[n*d:(n+1)*d]
		z, y := m.Logit(u, v), float64(s.Click)
		loss += math.Max(z, 0) + math.Log1p(math.Exp(-math.Abs(z))) - y*z // softplus(z) - y*z, stably
		dz := 1/(1+math.Exp(-z)) - y
		gu, gv := l.UGrad[n*d:(n+1)*d], l.IGrad[n*d:(n+1)*d]
		for k := range d {
			w := float64(m.Dense[k])
			gu[k], gv[k] = float32(dz*w*float64(v[k])), float32(dz*w*float64(u[k]))
			m.Grad[k] += float32(dz * float64(u[k]) * float64(v[k]))
		}
		m.Grad[d] += float32(dz)
	}
	return loss
}
