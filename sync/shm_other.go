//go:build !(linux && (amd64 || arm64))

package sync

import "errors"

const shmSupported = false

func shmCreate(int) (int, []byte, error) { return -1, nil, errors.New("shared memory not supported") }
func shmMap(int, int) ([]byte, error)    { return nil, errors.New("shared memory not supported") }
func shmUnmap([]byte)                    {}
func closeFD(int)                        {}
