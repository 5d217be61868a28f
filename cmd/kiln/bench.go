package main

import "fmt"

// benchModes holds the benchmarks: "serve" (the serving benchmark, like vllm
// bench serve) and "" (the single-process micro benchmark). Each registers
// itself from its own file.
var benchModes = map[string]func(args []string) error{}

func init() {
	register(&command{
		name:    "bench",
		summary: "measure speed: 'kiln bench' (decode/prefill micro benchmark), 'kiln bench serve' (serving benchmark)",
		run: func(args []string) error {
			mode := ""
			if len(args) > 0 && args[0] == "serve" {
				mode, args = "serve", args[1:]
			}
			f, ok := benchModes[mode]
			if !ok {
				return fmt.Errorf("benchmark %q is not available in this build", mode)
			}
			return f(args)
		},
	})
}
