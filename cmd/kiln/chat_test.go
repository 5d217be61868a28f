package main

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/kiln-llm/kiln/engine"
)

// A 30-line Go function, as a user would paste it.
const pastedFunction = `// fib returns the n-th Fibonacci number.
func fib(n int) int {
	if n < 2 {
		return n
	}
	a, b := 0, 1
	for i := 1; i < n; i++ {
		a, b = b, a+b
	}
	return b
}

// sum adds the numbers of xs.
func sum(xs []int) int {
	total := 0
	for _, x := range xs {
		total += x
	}
	return total
}

// main prints both.
func main() {
	fmt.Println(fib(10))
	fmt.Println(sum([]int{1, 2, 3}))
	for i := 0; i < 3; i++ {
		fmt.Println(i)
	}
	fmt.Println("done")
}`

// terminal is kiln chat running on a pseudo-terminal, as a user's shell
// runs it.
type terminal struct {
	t      *testing.T
	cmd    *exec.Cmd
	master *os.File
	mu     sync.Mutex
	screen bytes.Buffer // all output so far
	seen   int          // how much of it waitFor has passed
	exited chan error
}

// openPTY opens a pseudo-terminal pair of 50 rows of 120 columns.
func openPTY(t *testing.T) (master, slave *os.File) {
	t.Helper()
	m, err := os.OpenFile("/dev/ptmx", os.O_RDWR|syscall.O_NOCTTY, 0)
	if err != nil {
		t.Skipf("no pseudo-terminals here: %v", err)
	}
	fd := int(m.Fd())
	if err := unix.IoctlSetPointerInt(fd, unix.TIOCSPTLCK, 0); err != nil {
		t.Fatal(err)
	}
	n, err := unix.IoctlGetInt(fd, unix.TIOCGPTN)
	if err != nil {
		t.Fatal(err)
	}
	s, err := os.OpenFile(fmt.Sprintf("/dev/pts/%d", n), os.O_RDWR|syscall.O_NOCTTY, 0)
	if err != nil {
		t.Fatal(err)
	}
	if err := unix.IoctlSetWinsize(int(s.Fd()), unix.TIOCSWINSZ, &unix.Winsize{Row: 50, Col: 120}); err != nil {
		t.Fatal(err)
	}
	return m, s
}

func startChat(t *testing.T, state string, args ...string) *terminal {
	t.Helper()
	master, slave := openPTY(t)
	cmd := exec.Command(kilnBinary(t), append([]string{"chat", "--no-daemon", "--max-tokens", "6", "--temperature", "0"}, args...)...)
	// The line editor asks a terminal where its cursor is, which this one
	// would not answer (the readline library's advice for test terminals).
	inputrc := filepath.Join(t.TempDir(), "inputrc")
	if err := os.WriteFile(inputrc, []byte("set cursor-position-probe off\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	cmd.Env = append(os.Environ(), "XDG_STATE_HOME="+state, "XDG_RUNTIME_DIR="+t.TempDir(), "TERM=xterm", "INPUTRC="+inputrc)
	cmd.Stdin, cmd.Stdout, cmd.Stderr = slave, slave, slave
	cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true, Setctty: true}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	slave.Close()
	term := &terminal{t: t, cmd: cmd, master: master, exited: make(chan error, 1)}
	go func() {
		buf := make([]byte, 4096)
		for {
			n, err := master.Read(buf)
			term.mu.Lock()
			term.screen.Write(buf[:n])
			term.mu.Unlock()
			if err != nil {
				return
			}
		}
	}()
	go func() { term.exited <- cmd.Wait() }()
	t.Cleanup(func() {
		cmd.Process.Kill()
		master.Close()
	})
	return term
}

// waitFor waits until the output after what was waited for before has s.
func (term *terminal) waitFor(s string) {
	term.t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for {
		term.mu.Lock()
		out := term.screen.String()
		term.mu.Unlock()
		if i := strings.Index(out[term.seen:], s); i >= 0 {
			term.seen += i + len(s)
			return
		}
		if time.Now().After(deadline) {
			term.t.Fatalf("no %q on the terminal; it shows:\n%s", s, out[term.seen:])
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// send types keys.
func (term *terminal) send(keys string) {
	term.t.Helper()
	if _, err := term.master.WriteString(keys); err != nil {
		term.t.Fatal(err)
	}
}

// exit waits for the chat to end and returns its exit status.
func (term *terminal) exit() int {
	term.t.Helper()
	select {
	case err := <-term.exited:
		var ee *exec.ExitError
		if errors.As(err, &ee) {
			return ee.ExitCode()
		}
		if err != nil {
			term.t.Fatal(err)
		}
		return 0
	case <-time.After(30 * time.Second):
		term.mu.Lock()
		defer term.mu.Unlock()
		term.t.Fatalf("kiln chat did not exit; the terminal shows:\n%q", term.screen.String()[term.seen:])
		return -1
	}
}

func readSaved(t *testing.T, path string) chatSession {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	var s chatSession
	if err := json.Unmarshal(b, &s); err != nil {
		t.Fatal(err)
	}
	return s
}

// kiln chat on a terminal: a pasted 30-line function is one message, the
// up arrow recalls it, /set and /save work, Ctrl-C at an empty prompt
// leaves with 130; a second session finds the first's history with Ctrl-R
// and /load goes on with a saved conversation.
func TestChatOnATerminal(t *testing.T) {
	state, dir := t.TempDir(), t.TempDir()
	term := startChat(t, state)
	term.waitFor(">>> ")
	// A paste as a terminal sends it: bracketed, newlines as CR.
	term.send("\x1b[200~" + strings.ReplaceAll(pastedFunction, "\n", "\r") + "\x1b[201~\r")
	term.waitFor(">>> ")
	term.send("/save " + filepath.Join(dir, "one.json") + "\r")
	term.waitFor("(saved 2 messages")
	if s := readSaved(t, filepath.Join(dir, "one.json")); len(s.Messages) != 2 || s.Messages[0].Content != pastedFunction {
		t.Fatalf("after the paste: %d messages, the first %q", len(s.Messages), s.Messages[0].Content)
	}
	term.waitFor(">>> ")
	term.send("\x1b[A\x1b[A\r") // up twice: past /save, the function again
	term.waitFor(">>> ")
	term.send("/set temperature 0.5\r")
	term.waitFor("(set temperature 0.5)")
	term.send("/set top_k -1\r")
	term.waitFor("top_k must be a whole number")
	term.send("/save " + filepath.Join(dir, "two.json") + "\r")
	term.waitFor("(saved 4 messages")
	s := readSaved(t, filepath.Join(dir, "two.json"))
	if s.Messages[2].Content != pastedFunction || s.Params["temperature"] != 0.5 {
		t.Errorf("recalled %q, params %v", s.Messages[2].Content, s.Params)
	}
	term.waitFor(">>> ")
	term.send("half a line\x03") // Ctrl-C clears a line
	term.waitFor("^C")
	term.waitFor(">>> ")
	// Keys that come before the next line is read are the old line's.
	time.Sleep(200 * time.Millisecond)
	term.send("\x03") // and leaves at an empty one
	if code := term.exit(); code != 130 {
		t.Errorf("Ctrl-C at the prompt: exit status %d, want 130", code)
	}

	term = startChat(t, state)
	term.waitFor(">>> ")
	term.send("\x12sum adds") // Ctrl-R: the history of the first session
	term.waitFor("sum adds")
	term.send("\r")
	term.waitFor(">>> ")
	term.send("/save " + filepath.Join(dir, "three.json") + "\r")
	term.waitFor("(saved 2 messages")
	if s := readSaved(t, filepath.Join(dir, "three.json")); s.Messages[0].Content != pastedFunction {
		t.Errorf("found with Ctrl-R: %q", s.Messages[0].Content)
	}
	term.send("/load " + filepath.Join(dir, "two.json") + "\r")
	term.waitFor("(loaded 4 messages")
	term.send(`"""` + "\rfirst line\rsecond line\r" + `"""` + "\r")
	term.waitFor(">>> ")
	term.send("/save " + filepath.Join(dir, "four.json") + "\r")
	term.waitFor("(saved 6 messages")
	if s := readSaved(t, filepath.Join(dir, "four.json")); s.Messages[4].Content != "first line\nsecond line" || s.Params["temperature"] != 0.5 {
		t.Errorf("a \"\"\" block: %q, params %v", s.Messages[4].Content, s.Params)
	}
	term.send("/bye\r")
	if code := term.exit(); code != 0 {
		t.Errorf("/bye: exit status %d", code)
	}
}

// From a pipe, a message is a line or a """ block; a slash and a word make
// a command, a Go comment does not.
func TestChatPipeInput(t *testing.T) {
	r := newPipeReader(strings.NewReader("hello\n\"\"\"\nfunc f() {\n}\n\"\"\"\n\"\"\"one line\"\"\"\nlast"))
	var got []string
	for {
		m, err := r.read()
		if err != nil {
			break
		}
		got = append(got, m)
	}
	if want := []string{"hello", "func f() {\n}", "one line", "last"}; !slices.Equal(got, want) {
		t.Errorf("messages %q, want %q", got, want)
	}
	for text, want := range map[string]bool{"/set top_k 5": true, "/?": true, "// a comment": false, "/set\nmore": false, "/": false} {
		if isCommand(text) != want {
			t.Errorf("isCommand(%q) = %v", text, !want)
		}
	}
}

// /set takes the API's names (and Ollama's), checked by the engine's bounds.
func TestChatSet(t *testing.T) {
	p := params{}
	for _, c := range []struct{ name, value, err string }{
		{"temperature", "0.7", ""},
		{"num_predict", "64", ""},
		{"temperature", "5", "temperature must be between 0 and 2"},
		{"top_p", "0", "top_p must be greater than 0"},
		{"seed", "1.5", "whole number"},
		{"warmth", "1", "unknown parameter"},
		{"temperature", "hot", "not a number"},
	} {
		err := p.set(c.name, c.value)
		if c.err == "" && err != nil || c.err != "" && (err == nil || !strings.Contains(err.Error(), c.err)) {
			t.Errorf("/set %s %s: %v, want %q", c.name, c.value, err, c.err)
		}
	}
	if p.String() != "temperature 0.7, max_tokens 64" {
		t.Errorf("set: %s", p)
	}
	body := map[string]any{}
	p.request(body)
	if body["temperature"] != 0.7 || body["max_tokens"] != int64(64) {
		t.Errorf("request body %v", body)
	}
	if sp := p.sampling(engine.Sampling{TopK: 20}); sp.Temperature != 0.7 || sp.MaxTokens != 64 || sp.TopK != 20 {
		t.Errorf("sampling %+v", sp)
	}
	p.set("temperature", "default")
	if _, ok := p["temperature"]; ok {
		t.Error("/set temperature default kept it")
	}
}
