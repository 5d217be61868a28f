// Command kiln loads a Qwen3-family model once and serves it: an
// OpenAI-compatible HTTP API, a local daemon, an interactive chat and a pipe
// mode. Run "kiln help" for the commands.
package main

import (
	"errors"
	"fmt"
	"os"
	"sort"
	"syscall"
)

// errSignal is a command stopped by a signal (Ctrl-C: SIGINT), which the
// process exits with as shells report it: 128 + the signal's number, 130
// for Ctrl-C.
type errSignal struct{ syscall.Signal }

func (e errSignal) Error() string { return e.Signal.String() }

// command is one subcommand. Each lives in its own file and registers itself.
type command struct {
	name    string
	summary string
	run     func(args []string) error
}

var commands = map[string]*command{}

func register(c *command) { commands[c.name] = c }

func usage() {
	fmt.Fprintf(os.Stderr, "usage: kiln <command> [flags]\n\ncommands:\n")
	names := make([]string, 0, len(commands))
	for n := range commands {
		names = append(names, n)
	}
	sort.Strings(names)
	for _, n := range names {
		fmt.Fprintf(os.Stderr, "  %-10s %s\n", n, commands[n].summary)
	}
	fmt.Fprintf(os.Stderr, "\nRun 'kiln <command> -h' for a command's flags.\n")
}

func main() {
	if len(os.Args) < 2 || os.Args[1] == "help" || os.Args[1] == "-h" || os.Args[1] == "--help" {
		usage()
		if len(os.Args) < 2 {
			os.Exit(2)
		}
		return
	}
	c, ok := commands[os.Args[1]]
	if !ok {
		fmt.Fprintf(os.Stderr, "kiln: unknown command %q\n", os.Args[1])
		usage()
		os.Exit(2)
	}
	if err := c.run(os.Args[2:]); err != nil {
		var sig errSignal
		switch {
		case errors.As(err, new(errBadFlags)):
			os.Exit(2)
		case errors.As(err, &sig):
			os.Exit(128 + int(sig.Signal))
		}
		fmt.Fprintf(os.Stderr, "kiln %s: %v\n", c.name, err)
		os.Exit(1)
	}
}
