// Command schema-check loads a dashboard JSON file the way Grafana's own schema reads it:
// strictly, with Grafana's published dashboard, panel and Prometheus query types (the
// Grafana Foundation SDK, generated from the schemas Grafana ships). A field Grafana does not
// know, a value of the wrong type or a required field missing fails the check, with the
// path of what is wrong; then the schema's own constraints are validated.
//
//	go run . DASHBOARD.json
package main

import (
	"encoding/json"
	"fmt"
	"os"

	"github.com/grafana/grafana-foundation-sdk/go/cog"
	"github.com/grafana/grafana-foundation-sdk/go/cog/plugins"
	"github.com/grafana/grafana-foundation-sdk/go/dashboard"
)

func main() {
	if len(os.Args) != 2 {
		fmt.Fprintln(os.Stderr, "usage: schema-check DASHBOARD.json")
		os.Exit(2)
	}
	path := os.Args[1]
	raw, err := os.ReadFile(path)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(2)
	}
	// Panels and queries are variants chosen by their "type" and datasource: without the
	// default plugins registered, their options would be read as untyped JSON, unchecked.
	plugins.RegisterDefaultPlugins()
	var d dashboard.Dashboard
	if err := problems(d.UnmarshalJSONStrict(raw)); err != nil {
		fail(path, "does not load", err)
	}
	if err := problems(d.Validate()); err != nil {
		fail(path, "loads but breaks a constraint", err)
	}
	// The dashboard's reading stops short of keeping a valid panel (the same empty list
	// taken for an error), so its panels are read again one by one, and validated.
	var whole struct {
		Panels []json.RawMessage `json:"panels"`
	}
	if err := json.Unmarshal(raw, &whole); err != nil {
		fail(path, "does not load", err)
	}
	for i, p := range whole.Panels {
		var kind struct {
			Type string `json:"type"`
		}
		_ = json.Unmarshal(p, &kind)
		if kind.Type == "row" {
			var row dashboard.RowPanel
			err = problems(row.UnmarshalJSONStrict(p))
			if err == nil {
				err = problems(row.Validate())
			}
		} else {
			var panel dashboard.Panel
			err = problems(panel.UnmarshalJSONStrict(p))
			if err == nil {
				err = problems(panel.Validate())
			}
		}
		if err != nil {
			fail(path, fmt.Sprintf("panel %d (%s) does not load", i, kind.Type), err)
		}
	}
	fmt.Printf("%s: loads, %d panels, schema version %d\n", path, len(whole.Panels), d.SchemaVersion)
}

func fail(path, what string, err error) {
	fmt.Fprintf(os.Stderr, "%s: %s: %v\n", path, what, err)
	os.Exit(1)
}

// problems is err unless it is an empty list: the SDK returns its list of problems as an
// error even when the list is empty (a nil slice in a non-nil interface).
func problems(err error) error {
	if list, ok := err.(cog.BuildErrors); ok && len(list) == 0 {
		return nil
	}
	return err
}
