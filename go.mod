module github.com/kiln-llm/kiln

go 1.26
