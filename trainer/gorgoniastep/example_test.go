package gorgoniastep_test

import (
	"context"
	"fmt"

	"gorgonia.org/gorgonia"
	"gorgonia.org/tensor"

	"github.com/elastictrain/elastictrain/trainer/gorgoniastep"
)

// A linear model y = x·w + b with a squared error summed over the batch.
// Step fills the gradients with the sum of per-sample gradients, which the
// trainer's optimizer then applies through Params.
func Example() {
	build := func(g *gorgonia.ExprGraph, batch int, p gorgonia.Nodes) (gorgoniastep.Graph, error) {
		x := gorgonia.NewMatrix(g, tensor.Float32, gorgonia.WithShape(batch, 2), gorgonia.WithName("x"))
		y := gorgonia.NewVector(g, tensor.Float32, gorgonia.WithShape(batch), gorgonia.WithName("y"))
		pred := gorgonia.Must(gorgonia.Mul(x, p[0]))                                // (batch)
		pred = gorgonia.Must(gorgonia.Add(pred, gorgonia.Must(gorgonia.Sum(p[1])))) // + b
		diff := gorgonia.Must(gorgonia.Sub(pred, y))
		loss := gorgonia.Must(gorgonia.Sum(gorgonia.Must(gorgonia.Square(diff))))
		return gorgoniastep.Graph{Loss: loss, Inputs: gorgonia.Nodes{x, y}}, nil
	}
	m, err := gorgoniastep.New([]gorgoniastep.ParamSpec{
		{Name: "w", Shape: []int{2}},
		{Name: "b", Shape: []int{1}},
	}, build)
	if err != nil {
		fmt.Println(err)
		return
	}
	defer m.Close()
	copy(m.Params()[0].Value, []float32{1, 2})

	xs := []float32{1, 0, 0, 1, 1, 1}
	ys := []float32{0, 0, 0}
	for _, n := range []int{3, 2, 0} { // a rank's share may vary, and may be empty
		loss, err := m.Step(context.Background(), n, func(mc *gorgoniastep.Machine) error {
			copy(mc.Input(0), xs[:2*n])
			copy(mc.Input(1), ys[:n])
			return nil
		})
		if err != nil {
			fmt.Println(err)
			return
		}
		fmt.Printf("n=%d loss=%g dw=%v db=%v\n", n, loss, m.Params()[0].Grad, m.Params()[1].Grad)
	}
	// Output:
	// n=3 loss=14 dw=[8 10] db=[12]
	// n=2 loss=5 dw=[2 4] db=[6]
	// n=0 loss=0 dw=[0 0] db=[0]
}
