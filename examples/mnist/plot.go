package main

import (
	"errors"

	"github.com/elastictrain/elastictrain/examples/internal/launcher"
)

func writePlot(path string, sum launcher.Summary) error {
	return errors.New("-plot is not available yet")
}
