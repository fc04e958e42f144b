# Rack entry point of the Rails app (tests/e2e/test_rails.py); Puma loads it with -R or as ./config.ru.
require_relative "application"
run Rails.application
