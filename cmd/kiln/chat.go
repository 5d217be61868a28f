package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/signal"
	"strings"
	"sync/atomic"
	"syscall"
	"unicode"

	"github.com/kiln-llm/kiln/chat"
)

func init() {
	register(&command{name: "chat", summary: "interactive multi-turn chat (/help for its commands)", run: chatLoop})
}

const chatHelp = `commands:
  /exit, /bye       leave (or Ctrl-D)
  /reset            forget the conversation
  /think on|off     let the model think before answering
  /system TEXT      set the system prompt (and reset); "/system" alone clears it
  /set              show the sampling parameters set
  /set NAME VALUE   set one: temperature, top_p, top_k, min_p, repetition_penalty,
                    presence_penalty, frequency_penalty, seed, max_tokens ("default" unsets it)
  /save FILE        save the conversation (JSON); /load FILE goes on with one saved
  /stats            speed of the last answer
  /help             this text
keys (on a terminal): arrows and Emacs keys edit the line, Up/Down walk the history
(kept across sessions), Ctrl-R searches it, Ctrl-C stops an answer or clears the line;
a paste is one message however many lines it has, and """ opens a multi-line message
that the next """ closes.
`

// chatSession is the state of an interactive chat: what /save writes.
type chatSession struct {
	System   string         `json:"system,omitempty"`
	Think    bool           `json:"think"`
	Params   params         `json:"params,omitempty"`
	Messages []chat.Message `json:"messages"`
	last     *answerStats
}

func (s *chatSession) reset() { s.Messages = nil }

func (s *chatSession) turn(user string) *turn {
	var m []chat.Message
	if s.System != "" {
		m = append(m, chat.Message{Role: "system", Content: s.System})
	}
	return &turn{messages: append(append(m, s.Messages...), chat.Message{Role: "user", Content: user}), think: s.Think, params: s.Params}
}

// command runs a /command and reports whether to leave.
func (s *chatSession) command(line string, w io.Writer) (quit bool) {
	name, arg, _ := strings.Cut(strings.TrimSpace(line), " ")
	arg = strings.TrimSpace(arg)
	switch name {
	case "/exit", "/quit", "/bye":
		return true
	case "/reset", "/clear":
		s.reset()
		fmt.Fprintln(w, "(conversation cleared)")
	case "/think":
		switch arg {
		case "on":
			s.Think = true
		case "off":
			s.Think = false
		default:
			fmt.Fprintln(w, "usage: /think on|off")
			return false
		}
		fmt.Fprintf(w, "(thinking %s)\n", arg)
	case "/system":
		s.System = arg
		s.reset()
		if arg == "" {
			fmt.Fprintln(w, "(system prompt cleared; conversation cleared)")
		} else {
			fmt.Fprintln(w, "(system prompt set; conversation cleared)")
		}
	case "/set":
		s.set(arg, w)
	case "/save":
		if err := s.save(arg); err != nil {
			fmt.Fprintf(w, "error: %v\n", err)
			return false
		}
		fmt.Fprintf(w, "(saved %d messages to %s)\n", len(s.Messages), arg)
	case "/load":
		if err := s.load(arg); err != nil {
			fmt.Fprintf(w, "error: %v\n", err)
			return false
		}
		fmt.Fprintf(w, "(loaded %d messages from %s)\n", len(s.Messages), arg)
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

// isCommand reports whether a message is a /command: one line of a slash
// and a word ("// a comment" and a pasted text are messages).
func isCommand(text string) bool {
	t := strings.TrimSpace(text)
	return len(t) > 1 && t[0] == '/' && (t[1] == '?' || 'a' <= t[1] && t[1] <= 'z') && !strings.Contains(t, "\n")
}

// set runs "/set [NAME VALUE]".
func (s *chatSession) set(arg string, w io.Writer) {
	f := strings.Fields(arg)
	switch len(f) {
	case 0:
		if len(s.Params) == 0 {
			fmt.Fprintln(w, "(the model's defaults; /set NAME VALUE changes one)")
		} else {
			fmt.Fprintf(w, "(%s; the model's defaults otherwise)\n", s.Params)
		}
		return
	case 2:
	default:
		fmt.Fprintln(w, "usage: /set NAME VALUE (or /set NAME default); /help lists the names")
		return
	}
	if s.Params == nil {
		s.Params = params{}
	}
	if err := s.Params.set(f[0], f[1]); err != nil {
		fmt.Fprintf(w, "error: %v\n", err)
		return
	}
	fmt.Fprintf(w, "(set %s %s)\n", f[0], f[1])
}

// save writes the conversation, its system prompt and its settings.
func (s *chatSession) save(path string) error {
	if path == "" {
		return errors.New("usage: /save FILE")
	}
	b, err := json.MarshalIndent(s, "", "  ")
	if err != nil {
		return err
	}
	return os.WriteFile(path, append(b, '\n'), 0o600)
}

// load replaces the session with one /save wrote.
func (s *chatSession) load(path string) error {
	if path == "" {
		return errors.New("usage: /load FILE")
	}
	b, err := os.ReadFile(path)
	if err != nil {
		return err
	}
	var in chatSession
	if err := json.Unmarshal(b, &in); err != nil {
		return fmt.Errorf("%s is not a saved chat: %w", path, err)
	}
	for i, m := range in.Messages {
		if m.Role != "user" && m.Role != "assistant" && m.Role != "tool" {
			return fmt.Errorf("%s: message %d has role %q", path, i, m.Role)
		}
	}
	if err := in.Params.check(); err != nil {
		return fmt.Errorf("%s: %w", path, err)
	}
	*s = in
	return nil
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
	s := &chatSession{System: c.system, Think: c.think, Params: c.params()}
	tty := isTerminal(os.Stdin) && isTerminal(os.Stdout)
	var in messageReader = newPipeReader(os.Stdin)
	dim, reset := "", ""
	if tty {
		dim, reset = "\033[2m", "\033[0m"
		in = newTerminalReader()
		fmt.Fprintln(os.Stderr, `kiln chat: type a message, /help for commands, """ for several lines, Ctrl-D to leave`)
	}
	// Ctrl-C stops the answer being generated. At the prompt the terminal
	// is raw and the line editor reads it as a key; a pipe's reader leaves.
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
	for {
		line, err := in.read()
		switch {
		case errors.Is(err, errInterrupted):
			return errSignal{syscall.SIGINT}
		case errors.Is(err, io.EOF):
			if tty {
				fmt.Println()
			}
			return nil
		case err != nil:
			return err
		}
		// Blank lines around a message are no part of it (a history entry
		// has none); the first line's indentation is.
		if line = strings.TrimRightFunc(strings.TrimLeft(line, "\r\n"), unicode.IsSpace); strings.TrimSpace(line) == "" {
			continue
		}
		if isCommand(line) {
			if s.command(line, os.Stdout) {
				return nil
			}
			continue
		}
		ctx, cancel := context.WithCancel(context.Background())
		answering.Store(&cancel)
		var answer, reasoning strings.Builder
		inReasoning := false
		st, err := a.answer(ctx, s.turn(line), func(text, r string) {
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
		s.Messages = append(s.Messages, chat.Message{Role: "user", Content: line},
			chat.Message{Role: "assistant", Content: answer.String(), ReasoningContent: reasoning.String()})
	}
}
