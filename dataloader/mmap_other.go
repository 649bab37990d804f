//go:build !unix

package dataloader

import (
	"errors"
	"os"
)

// mapFile is not available here: OpenRecordsMapped reads with ReadAt.
func mapFile(*os.File, int) ([]byte, error) { return nil, errors.ErrUnsupported }

func unmapFile([]byte) {}
