package server

import (
	"context"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/openai/openai-go/v3"

	"github.com/kiln-llm/kiln/engine"
)

// Shutdown lets an in-flight stream finish when there is time, and refuses
// new work meanwhile.
func TestShutdownDrainsInFlight(t *testing.T) {
	ts := startServer(t, Options{}, engine.Options{})
	p := greedy("tell me everything", 60)
	p.SetExtraFields(map[string]any{"ignore_eos": true})
	s := ts.client().Chat.Completions.NewStreaming(context.Background(), p)
	if !s.Next() {
		t.Fatal(s.Err())
	}
	done := make(chan error, 1)
	go func() { done <- ts.srv.Shutdown(context.Background()) }()
	// New requests are refused once draining starts.
	deadline := time.Now().Add(5 * time.Second)
	for !ts.srv.draining.Load() && time.Now().Before(deadline) {
		time.Sleep(time.Millisecond)
	}
	if resp, err := http.Post(ts.url+"/v1/chat/completions", "application/json", strings.NewReader(`{}`)); err == nil {
		resp.Body.Close()
		t.Errorf("a new request while draining got %s", resp.Status)
	}
	var acc openai.ChatCompletionAccumulator
	acc.AddChunk(s.Current())
	for s.Next() {
		acc.AddChunk(s.Current())
	}
	if err := s.Err(); err != nil {
		t.Fatal(err)
	}
	if acc.Choices[0].FinishReason != "length" {
		t.Errorf("drained stream finished with %q", acc.Choices[0].FinishReason)
	}
	if err := <-done; err != nil {
		t.Errorf("shutdown: %v", err)
	}
}

// When the drain timeout passes, in-flight requests are cancelled and their
// sequences freed.
func TestShutdownTimeoutCancels(t *testing.T) {
	ts := startServer(t, Options{}, engine.Options{NoCache: true})
	p := greedy("tell me everything", 3000)
	p.SetExtraFields(map[string]any{"ignore_eos": true})
	s := ts.client().Chat.Completions.NewStreaming(context.Background(), p)
	if !s.Next() {
		t.Fatal(s.Err())
	}
	ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
	defer cancel()
	start := time.Now()
	err := ts.srv.Shutdown(ctx)
	if err == nil || !strings.Contains(err.Error(), "cancelled 1") {
		t.Errorf("shutdown: %v", err)
	}
	if d := time.Since(start); d > 5*time.Second {
		t.Errorf("shutdown took %v", d)
	}
	for s.Next() {
	}
	// The client is told why its answer stopped.
	if err := s.Err(); err == nil || !strings.Contains(err.Error(), "shutting down") {
		t.Errorf("the cancelled stream ended with %v", err)
	}
	waitIdle(t, ts.eng, 0)
}
