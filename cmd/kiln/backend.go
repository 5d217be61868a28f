package main

import (
	"fmt"

	"github.com/kiln-llm/kiln/backend"
	"github.com/kiln-llm/kiln/backend/cpu"
)

// openBackend returns the named compute backend: "cpu", or "auto" (also
// "") for the best one available on this machine.
func openBackend(name string) (backend.Backend, error) {
	switch name {
	case "auto", "":
		return cpu.New(cpu.Options{}), nil
	case "cpu":
		return cpu.New(cpu.Options{}), nil
	}
	return nil, fmt.Errorf("unknown backend %q (want auto or cpu)", name)
}
