package main

import (
	"fmt"

	"github.com/kiln-llm/kiln/backend"
	"github.com/kiln-llm/kiln/backend/cpu"
	"github.com/kiln-llm/kiln/backend/cuda"
)

// openBackend returns the named compute backend: "cpu", or "auto" (also
// "") for the best one available on this machine.
func openBackend(name string) (backend.Backend, error) {
	switch name {
	case "auto", "":
		return cpu.New(cpu.Options{}), nil
	case "cpu":
		return cpu.New(cpu.Options{}), nil
	case "cuda":
		b, err := cuda.New(cuda.Options{})
		if err != nil {
			return nil, err
		}
		return b, nil
	}
	return nil, fmt.Errorf("unknown backend %q (want auto or cpu)", name)
}
