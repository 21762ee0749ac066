#!/usr/bin/env bash
echo "cli tests: placeholder"
