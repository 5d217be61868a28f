package main

import (
	"errors"
	"fmt"
	"math"
	"slices"
	"strconv"
	"strings"

	"github.com/kiln-llm/kiln/engine"
)

// params are the sampling parameters a client (kiln run, kiln chat) sets
// over the model's defaults, by their OpenAI names; chat's /set changes
// them. The same values go into an engine.Sampling in this process and into
// a request's JSON for the daemon, so a parameter means the same either way.
type params map[string]float64

// paramNames are the parameters /set knows, with what each is.
var paramNames = []struct{ name, help string }{
	{"temperature", "0 is greedy; 0 to 2"},
	{"top_p", "nucleus sampling; above 0, at most 1"},
	{"top_k", "the k most likely tokens; 0 for all"},
	{"min_p", "drop tokens below min_p x the most likely's probability; 0 to 1"},
	{"repetition_penalty", "1 is none"},
	{"presence_penalty", "-2 to 2"},
	{"frequency_penalty", "-2 to 2"},
	{"seed", "fixes the random choices"},
	{"max_tokens", "the most tokens of an answer; 0 for no limit"},
}

// paramAliases are Ollama's names of the same parameters.
var paramAliases = map[string]string{"num_predict": "max_tokens", "repeat_penalty": "repetition_penalty"}

// integral are the parameters that take whole numbers.
var integral = []string{"top_k", "seed", "max_tokens"}

// set parses and checks one parameter against the engine's bounds.
func (p params) set(name, value string) error {
	if n, ok := paramAliases[name]; ok {
		name = n
	}
	if !slices.ContainsFunc(paramNames, func(n struct{ name, help string }) bool { return n.name == name }) {
		names := make([]string, len(paramNames))
		for i, n := range paramNames {
			names[i] = n.name
		}
		return fmt.Errorf("unknown parameter %q; /set takes %s", name, strings.Join(names, ", "))
	}
	if value == "default" {
		delete(p, name)
		return nil
	}
	v, err := strconv.ParseFloat(value, 64)
	if err != nil || math.IsNaN(v) || math.IsInf(v, 0) {
		return fmt.Errorf("%s %q is not a number", name, value)
	}
	if slices.Contains(integral, name) && (v != math.Trunc(v) || v < 0) {
		return fmt.Errorf("%s must be a whole number, at least 0, not %s", name, value)
	}
	next := params{}
	for k, x := range p {
		next[k] = x
	}
	next[name] = v
	if err := next.check(); err != nil {
		return err
	}
	p[name] = v
	return nil
}

// check validates the parameters as the engine would.
func (p params) check() error {
	sp := p.sampling(engine.Sampling{})
	if v, ok := p["top_p"]; ok && v == 0 {
		return errors.New("top_p must be greater than 0")
	}
	if err := sp.Validate(); err != nil {
		return err
	}
	return nil
}

// sampling returns defaults with the parameters set.
func (p params) sampling(defaults engine.Sampling) engine.Sampling {
	sp := defaults
	floats := map[string]*float32{"temperature": &sp.Temperature, "top_p": &sp.TopP, "min_p": &sp.MinP,
		"repetition_penalty": &sp.RepetitionPenalty, "presence_penalty": &sp.PresencePenalty, "frequency_penalty": &sp.FrequencyPenalty}
	for name, v := range p {
		switch f := floats[name]; {
		case f != nil:
			*f = float32(v)
		case name == "top_k":
			sp.TopK = int(v)
		case name == "max_tokens":
			sp.MaxTokens = int(v)
		case name == "seed":
			seed := uint64(v)
			sp.Seed = &seed
		}
	}
	return sp
}

// request adds the parameters to a chat completions request body.
func (p params) request(body map[string]any) {
	for name, v := range p {
		switch {
		case name == "max_tokens" && v == 0: // no limit: the server's default
		case slices.Contains(integral, name):
			body[name] = int64(v)
		default:
			body[name] = v
		}
	}
}

// String lists the parameters set, "name value" by name.
func (p params) String() string {
	var parts []string
	for _, n := range paramNames {
		if v, ok := p[n.name]; ok {
			parts = append(parts, n.name+" "+strconv.FormatFloat(v, 'g', -1, 64))
		}
	}
	return strings.Join(parts, ", ")
}
