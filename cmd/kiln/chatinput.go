package main

import (
	"bufio"
	"errors"
	"io"
	"os"
	"path/filepath"
	"strings"

	"github.com/reeflective/readline"
)

// messageReader reads the chat's messages: one a line, or several lines
// between """ and """ (and on a terminal, a paste of any length).
type messageReader interface {
	read() (string, error) // io.EOF at the end, errInterrupted for Ctrl-C at an empty prompt
}

// errInterrupted is Ctrl-C at an empty prompt: the user leaves.
var errInterrupted = errors.New("interrupted")

const fence = `"""`

// openBlock reports whether text opens a """ block that it does not close.
func openBlock(text string) bool {
	t := strings.TrimSpace(text)
	return strings.HasPrefix(t, fence) && !strings.HasSuffix(t[len(fence):], fence)
}

// unfence returns a closed """ block's text; other text as it is.
func unfence(text string) string {
	t := strings.TrimSpace(text)
	if len(t) < 2*len(fence) || !strings.HasPrefix(t, fence) || !strings.HasSuffix(t, fence) {
		return text
	}
	return strings.Trim(t[len(fence):len(t)-len(fence)], "\n")
}

// pipeReader reads messages from a pipe or file: a line each, or a """
// block.
type pipeReader struct{ r *bufio.Reader }

func newPipeReader(f io.Reader) *pipeReader {
	// A reader, not a Scanner: a line of any length is one message (too
	// long for the context, it gets that error and the chat goes on).
	return &pipeReader{bufio.NewReader(f)}
}

func (p *pipeReader) read() (string, error) {
	text, err := p.line()
	for err == nil && openBlock(text) {
		var more string
		more, err = p.line()
		text += "\n" + more
	}
	if err != nil && text == "" {
		return "", err
	}
	return unfence(text), nil
}

func (p *pipeReader) line() (string, error) {
	text, err := p.r.ReadString('\n')
	if err == io.EOF && text != "" {
		err = nil
	}
	return strings.TrimRight(text, "\r\n"), err
}

// terminalReader edits messages on a terminal with a readline library:
// Emacs keys (or vi's, from ~/.inputrc), a history kept across sessions
// (historyPath) that the arrows walk and Ctrl-R searches, bracketed paste
// (a pasted text is one message, its newlines kept) and """ blocks, which
// Enter continues until they are closed.
type terminalReader struct{ rl *readline.Shell }

func newTerminalReader() *terminalReader {
	rl := readline.NewShell()
	rl.Config.Set("enable-bracketed-paste", true)
	rl.Prompt.Primary(func() string { return ">>> " })
	rl.Prompt.Secondary(func() string { return "... " })
	rl.AcceptMultiline = func(line []rune) bool { return !openBlock(string(line)) }
	if path, err := historyPath(); err == nil {
		rl.History.AddFromFile("history", path)
	}
	return &terminalReader{rl}
}

func (t *terminalReader) read() (string, error) {
	for {
		text, err := t.rl.Readline()
		switch {
		case errors.Is(err, readline.ErrInterrupt) && strings.TrimSpace(text) != "":
			continue // Ctrl-C on a line: a new, empty one
		case errors.Is(err, readline.ErrInterrupt):
			return "", errInterrupted
		case err != nil:
			return "", err
		}
		return unfence(text), nil
	}
}

// historyPath is the chat history file, $XDG_STATE_HOME/kiln/chat_history
// (~/.local/state/kiln/chat_history), its directory made private.
func historyPath() (string, error) {
	dir := os.Getenv("XDG_STATE_HOME")
	if dir == "" {
		home, err := os.UserHomeDir()
		if err != nil {
			return "", err
		}
		dir = filepath.Join(home, ".local", "state")
	}
	dir = filepath.Join(dir, "kiln")
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return "", err
	}
	return filepath.Join(dir, "chat_history"), nil
}
