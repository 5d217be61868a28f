package main

import (
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"os"
	"strings"
	"unicode/utf8"
)

func init() {
	register(&command{
		name:    "tokenize",
		summary: "print the token ids of a text as a JSON array: kiln tokenize \"text\" (or stdin)",
		run:     func(args []string) error { return tokenize(args, os.Stdin, os.Stdout) },
	})
}

// tokenize encodes the text arguments (joined by spaces), or else all of
// in, byte for byte, as HF's encode(text, add_special_tokens=False) would,
// and writes the ids to out.
func tokenize(args []string, in io.Reader, out io.Writer) error {
	fs := flag.NewFlagSet("tokenize", flag.ContinueOnError)
	model := fs.String("model", "", modelFlagHelp("tokenizer.json", "; default: the embedded demo model"))
	fs.Usage = func() {
		fmt.Fprintf(fs.Output(), "usage: kiln tokenize [--model M] [\"text\"]   (without text, stdin)\n")
		fs.PrintDefaults()
	}
	pos, err := parseInterspersed(fs, args)
	if err != nil {
		return err
	}
	path, err := resolveModel(*model)
	if err != nil {
		return err
	}
	tok, err := path.tokenizer()
	if err != nil {
		return err
	}
	text, source := []byte(strings.Join(pos, " ")), "the text"
	if len(pos) == 0 {
		if text, err = io.ReadAll(in); err != nil {
			return fmt.Errorf("read stdin: %w", err)
		}
		source = "stdin"
	}
	if off := invalidUTF8Offset(text); off >= 0 {
		return fmt.Errorf("%s is not valid UTF-8: invalid byte 0x%02x at offset %d", source, text[off], off)
	}
	ids, err := json.Marshal(tok.Encode(string(text)))
	if err != nil {
		return err
	}
	_, err = fmt.Fprintf(out, "%s\n", ids)
	return err
}

// invalidUTF8Offset returns the offset of the first byte that does not start
// a valid UTF-8 character, or -1.
func invalidUTF8Offset(b []byte) int {
	for i := 0; i < len(b); {
		r, n := utf8.DecodeRune(b[i:])
		if r == utf8.RuneError && n <= 1 {
			return i
		}
		i += n
	}
	return -1
}
