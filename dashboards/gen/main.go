// Command gen writes the dashboards' JSON files (go generate ./...).
package main

import (
	"fmt"
	"os"
	"path/filepath"

	"github.com/shardlock/shardlock/dashboards"
)

func main() {
	dir := "."
	if len(os.Args) > 1 {
		dir = os.Args[1]
	}
	for _, d := range dashboards.All() {
		db, err := d.Build()
		if err != nil {
			fmt.Fprintln(os.Stderr, "gen:", d.File, err)
			os.Exit(1)
		}
		b, err := dashboards.JSON(db)
		if err != nil {
			fmt.Fprintln(os.Stderr, "gen:", d.File, err)
			os.Exit(1)
		}
		if err := os.WriteFile(filepath.Join(dir, d.File), b, 0o644); err != nil {
			fmt.Fprintln(os.Stderr, "gen:", err)
			os.Exit(1)
		}
	}
}
