package main

import (
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"

	"github.com/kiln-llm/kiln/chat"
)

func init() {
	register(&command{
		name:    "render",
		summary: "print the prompt a model's chat template makes of a JSON request on stdin",
		run:     render,
	})
}

// renderRequest is the part of a chat request that the template sees.
type renderRequest struct {
	Messages            []chat.Message             `json:"messages"`
	Tools               []chat.Tool                `json:"tools"`
	AddGenerationPrompt *bool                      `json:"add_generation_prompt"` // default true
	ChatTemplateKwargs  map[string]json.RawMessage `json:"chat_template_kwargs"`  // raw: nested keys keep their order
}

// render is "kiln render --model M": it reads one JSON object
// {"messages", "tools", "add_generation_prompt", "chat_template_kwargs"}
// from stdin and prints exactly the rendered prompt. The directory needs only
// the tokenizer files (chat_template.jinja or tokenizer_config.json).
func render(args []string) error {
	fs := flag.NewFlagSet("kiln render", flag.ContinueOnError)
	dir := fs.String("model", "", modelFlagHelp("chat_template.jinja or tokenizer_config.json", "; default: the embedded demo model"))
	fs.Usage = func() {
		fmt.Fprintf(fs.Output(), "usage: kiln render [--model M] < request.json\n\n"+
			"Prints the prompt the model's chat template makes of the request: a JSON object with\n"+
			"\"messages\", \"tools\", \"add_generation_prompt\" (default true) and \"chat_template_kwargs\".\n\n")
		fs.PrintDefaults()
	}
	if err := parseFlags(fs, args); err != nil {
		return err
	}
	if fs.NArg() > 0 {
		fs.Usage()
		return errors.New("no arguments are taken: the request comes on stdin")
	}
	path, err := resolveModel(*dir)
	if err != nil {
		return err
	}
	tpl, err := path.template()
	if err != nil {
		return err
	}
	var req renderRequest
	dec := json.NewDecoder(os.Stdin)
	if err := dec.Decode(&req); err != nil {
		return fmt.Errorf("reading the request from stdin: %w", err)
	}
	if _, err := dec.Token(); err != io.EOF {
		return errors.New("reading the request from stdin: more than one JSON value")
	}
	in := &chat.RenderInput{
		Messages:            req.Messages,
		Tools:               req.Tools,
		AddGenerationPrompt: req.AddGenerationPrompt == nil || *req.AddGenerationPrompt,
		Kwargs:              map[string]any{},
	}
	for k, v := range req.ChatTemplateKwargs {
		in.Kwargs[k] = v
	}
	prompt, err := tpl.Render(in)
	if err != nil {
		return err
	}
	_, err = io.WriteString(os.Stdout, prompt)
	return err
}
