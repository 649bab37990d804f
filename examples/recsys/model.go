package main

import (
	"math"

	"github.com/elastictrain/elastictrain/sync"
	"github.com/elastictrain/elastictrain/trainer"
)

// Tables of the parameter server.
const (
	tableUsers = 0
	tableItems = 1
)

// Model is the click-through model: a user embedding U[u] and an item
// embedding V[i] of Dim values each (sparse, on the parameter server), and
// a dense weight per dimension W plus a bias C (allreduced):
//
//	logit(u, i) = sum_k W[k] * U[u][k] * V[i][k] + C
//
// trained with the logistic loss. W and C make the dense half of a hybrid
// step (as in DLRM, the dense part is allreduced while the embeddings go
// through the parameter server).
type Model struct {
	Dim   int
	Dense []float32 // W (Dim values) then C
	Grad  []float32 // gradient of Dense
}

// NewModel returns a model of dimension dim with W = 1 and C = 0.
func NewModel(dim int) *Model {
	m := &Model{Dim: dim, Dense: make([]float32, dim+1), Grad: make([]float32, dim+1)}
	for k := 0; k < dim; k++ {
		m.Dense[k] = 1
	}
	return m
}

// Params returns the dense parameters for a trainer optimizer.
func (m *Model) Params() []trainer.Param {
	return []trainer.Param{{Name: "dense", Shape: []int{m.Dim + 1}, Value: m.Dense, Grad: m.Grad}}
}

// Tables returns the parameter-server tables: users and items, Dim wide,
// trained with sparse Adagrad at learning rate lr.
func Tables(users, items, dim int, lr float64, seed uint64) []sync.TableSpec {
	opt := sync.NewSparseAdagrad(lr)
	return []sync.TableSpec{
		{Name: "users", Rows: int64(users), Dim: dim, Optimizer: opt, InitScale: 0.1, Seed: seed},
		{Name: "items", Rows: int64(items), Dim: dim, Optimizer: opt, InitScale: 0.1, Seed: seed + 1},
	}
}

// Lookup is one rank's batch with its distinct rows: the pulled embeddings
// and, after Backward, their gradients.
type Lookup struct {
	Users, Items   []int64   // distinct row IDs
	UVals, IVals   []float32 // pulled rows, len(Users)*Dim and len(Items)*Dim
	UGrad, IGrad   []float32 // gradients of the summed loss
	uSlot, iSlot   []int32   // per sample: index into Users / Items
	uIndex, iIndex map[int64]int32
}

// Prepare lists the distinct users and items of samples and sizes the
// buffers.
func (l *Lookup) Prepare(samples []Sample, dim int) {
	if l.uIndex == nil {
		l.uIndex, l.iIndex = map[int64]int32{}, map[int64]int32{}
	}
	clear(l.uIndex)
	clear(l.iIndex)
	l.Users, l.Items = l.Users[:0], l.Items[:0]
	l.uSlot, l.iSlot = l.uSlot[:0], l.iSlot[:0]
	for _, s := range samples {
		u, ok := l.uIndex[int64(s.User)]
		if !ok {
			u = int32(len(l.Users))
			l.uIndex[int64(s.User)] = u
			l.Users = append(l.Users, int64(s.User))
		}
		i, ok := l.iIndex[int64(s.Item)]
		if !ok {
			i = int32(len(l.Items))
			l.iIndex[int64(s.Item)] = i
			l.Items = append(l.Items, int64(s.Item))
		}
		l.uSlot, l.iSlot = append(l.uSlot, u), append(l.iSlot, i)
	}
	l.UVals = grow(l.UVals, len(l.Users)*dim)
	l.IVals = grow(l.IVals, len(l.Items)*dim)
	l.UGrad = grow(l.UGrad, len(l.Users)*dim)
	l.IGrad = grow(l.IGrad, len(l.Items)*dim)
}

func grow(b []float32, n int) []float32 {
	if cap(b) < n {
		return make([]float32, n)
	}
	return b[:n]
}

// Logit returns the model's logit for embeddings u and v.
func (m *Model) Logit(u, v []float32) float64 {
	z := float64(m.Dense[m.Dim])
	for k := 0; k < m.Dim; k++ {
		z += float64(m.Dense[k]) * float64(u[k]) * float64(v[k])
	}
	return z
}

// Backward runs forward and backward over samples with the pulled rows in
// l. It returns the SUM of the per-sample logistic losses and leaves the
// SUM of the per-sample gradients in l.UGrad, l.IGrad and m.Grad.
func (m *Model) Backward(samples []Sample, l *Lookup) float64 {
	d := m.Dim
	clear(l.UGrad)
	clear(l.IGrad)
	clear(m.Grad)
	loss := 0.0
	for n, s := range samples {
		us, is := int(l.uSlot[n])*d, int(l.iSlot[n])*d
		u, v := l.UVals[us:us+d], l.IVals[is:is+d]
		z := m.Logit(u, v)
		y := float64(s.Click)
		// loss = softplus(z) - y*z, computed stably
		if z > 0 {
			loss += z + math.Log1p(math.Exp(-z)) - y*z
		} else {
			loss += math.Log1p(math.Exp(z)) - y*z
		}
		dz := 1/(1+math.Exp(-z)) - y
		gu, gv := l.UGrad[us:us+d], l.IGrad[is:is+d]
		for k := 0; k < d; k++ {
			w := float64(m.Dense[k])
			gu[k] += float32(dz * w * float64(v[k]))
			gv[k] += float32(dz * w * float64(u[k]))
			m.Grad[k] += float32(dz * float64(u[k]) * float64(v[k]))
		}
		m.Grad[d] += float32(dz)
	}
	return loss
}
