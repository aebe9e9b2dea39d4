//go:build tools

// Package tools keeps the engine simulator's command in this module's graph.
package tools

import _ "github.com/llm-d/llm-d-inference-sim/cmd/llm-d-inference-sim"
