package main

import (
	"bufio"
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/signal"
	"strings"
	"sync/atomic"

	"github.com/kiln-llm/kiln/chat"
)

func init() {
	register(&command{name: "chat", summary: "interactive multi-turn chat (/help for its commands)", run: chatLoop})
}

const chatHelp = `commands:
  /exit, /quit      leave (or Ctrl-D)
  /reset            forget the conversation
  /think on|off     let the model think before answering
  /system TEXT      set the system prompt (and reset); "/system" alone clears it
  /stats            speed of the last answer
  /help             this text
`

// chatSession is the state of an interactive chat.
type chatSession struct {
	system  string
	history []chat.Message
	think   bool
	last    *answerStats
}

func (s *chatSession) reset() { s.history = nil }

func (s *chatSession) messages(user string) []chat.Message {
	var m []chat.Message
	if s.system != "" {
		m = append(m, chat.Message{Role: "system", Content: s.system})
	}
	return append(append(m, s.history...), chat.Message{Role: "user", Content: user})
}

// command runs a /command and reports whether to leave.
func (s *chatSession) command(line string, w io.Writer) (quit bool) {
	name, arg, _ := strings.Cut(strings.TrimSpace(line), " ")
	arg = strings.TrimSpace(arg)
	switch name {
	case "/exit", "/quit", "/bye":
		return true
	case "/reset":
		s.reset()
		fmt.Fprintln(w, "(conversation cleared)")
	case "/think":
		switch arg {
		case "on":
			s.think = true
		case "off":
			s.think = false
		default:
			fmt.Fprintln(w, "usage: /think on|off")
			return false
		}
		fmt.Fprintf(w, "(thinking %s)\n", arg)
	case "/system":
		s.system = arg
		s.reset()
		if arg == "" {
			fmt.Fprintln(w, "(system prompt cleared; conversation cleared)")
		} else {
			fmt.Fprintln(w, "(system prompt set; conversation cleared)")
		}
	case "/stats":
		if s.last == nil {
			fmt.Fprintln(w, "(no answer yet)")
			return false
		}
		st := s.last
		fmt.Fprintf(w, "prompt %d tokens (%d from cache), answer %d tokens; first token after %v, %.1f tok/s\n",
			st.promptTokens, st.cachedTokens, st.completionTokens, st.ttft.Round(1e6), st.tokensPerSecond())
	case "/help", "/?":
		fmt.Fprint(w, chatHelp)
	default:
		fmt.Fprintf(w, "unknown command %s; /help lists them\n", name)
	}
	return false
}

func chatLoop(args []string) error {
	var c clientFlags
	fs := flag.NewFlagSet("kiln chat", flag.ContinueOnError)
	c.register(fs)
	if err := parseFlags(fs, args); err != nil {
		return err
	}
	if fs.NArg() > 0 {
		return fmt.Errorf("unexpected arguments %q (kiln chat reads messages from the terminal)", fs.Args())
	}
	if err := c.check(); err != nil {
		return err
	}
	setupLogging(c.verbose, slog.LevelWarn)
	c.model.conversations = true
	a, err := c.connect()
	if err != nil {
		return err
	}
	defer a.close()
	s := &chatSession{system: c.system, think: c.think}
	tty := isTerminal(os.Stdin) && isTerminal(os.Stdout)
	dim, reset := "", ""
	if tty {
		dim, reset = "\033[2m", "\033[0m"
		fmt.Fprintln(os.Stderr, "kiln chat: type a message, /help for commands, Ctrl-D to leave")
	}
	// Ctrl-C stops the answer being generated; at the prompt it leaves.
	var answering atomic.Pointer[context.CancelFunc]
	sigs := make(chan os.Signal, 1)
	signal.Notify(sigs, os.Interrupt)
	defer signal.Stop(sigs)
	go func() {
		for range sigs {
			if cancel := answering.Load(); cancel != nil {
				(*cancel)()
				continue
			}
			fmt.Println()
			os.Exit(130)
		}
	}()
	// A reader, not a Scanner: a pasted line of any length is one message
	// (too long for the context, it gets that error and the chat goes on).
	in := bufio.NewReader(os.Stdin)
	for {
		if tty {
			fmt.Print(">>> ")
		}
		text, err := in.ReadString('\n')
		if err != nil && text == "" {
			if tty {
				fmt.Println()
			}
			if err == io.EOF {
				return nil
			}
			return err
		}
		line := strings.TrimSpace(text)
		if line == "" {
			continue
		}
		if strings.HasPrefix(line, "/") {
			if s.command(line, os.Stdout) {
				return nil
			}
			continue
		}
		ctx, cancel := context.WithCancel(context.Background())
		answering.Store(&cancel)
		var answer, reasoning strings.Builder
		inReasoning := false
		st, err := a.answer(ctx, &turn{messages: s.messages(line), think: s.think}, func(text, r string) {
			if r != "" {
				if !inReasoning {
					fmt.Print(dim)
					inReasoning = true
				}
				fmt.Print(r)
				reasoning.WriteString(r)
			}
			if text != "" {
				if inReasoning {
					fmt.Print(reset)
					inReasoning = false
				}
				fmt.Print(text)
				answer.WriteString(text)
			}
		})
		answering.Store(nil)
		cancel()
		if inReasoning {
			fmt.Print(reset)
		}
		fmt.Println()
		if errors.Is(err, context.Canceled) {
			fmt.Fprintln(os.Stderr, "(stopped)")
			continue
		}
		if err != nil {
			fmt.Fprintf(os.Stderr, "error: %v\n", err)
			continue
		}
		s.last = &st
		s.history = append(s.history, chat.Message{Role: "user", Content: line},
			chat.Message{Role: "assistant", Content: answer.String(), ReasoningContent: reasoning.String()})
	}
}
