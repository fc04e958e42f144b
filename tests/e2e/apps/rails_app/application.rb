# A minimal Rails 7.2 application for tests/e2e/test_rails.py: ActionController and ActiveRecord (sqlite3) from
# Debian's own packages, loaded without Bundler, no generators; everything in this one file.
#
# Environment:
#   LEDGER_DB      the sqlite3 database file (created and seeded at boot)
#   RVGOLDEN_DIR   tests/golden's extension (the /golden action captures rb_profile_frames of every thread)
#   RVGOLDEN_OUT   where /golden writes that capture (and, in RVGOLDEN_OUT.t, the CLOCK_MONOTONIC ns before and after)
#
# Actions (GET):
#   /health          200 "ok"
#   /cpu             ~20 ms of pure-Ruby work in LedgerCruncher.reconcile
#   /db              ActiveRecord queries and one insert
#   /nap?ms=N        Kernel#sleep for N ms (default 20)
#   /locked?ms=N     takes the shared LEDGER_LOCK (contended) and works N ms (default 3) inside it
#   /hold?ms=N       takes LEDGER_LOCK and sleeps N ms inside it (the golden capture's lock holder)
#   /golden?ms=N     sleeps N ms (the other requests settle where they block), then RvGolden.capture
require "rails"
require "active_record/railtie"
require "action_controller/railtie"

ENV["DATABASE_URL"] = "sqlite3:#{ENV.fetch("LEDGER_DB")}?pool=12&timeout=10000"

module LedgerApp
  class Application < Rails::Application
    config.load_defaults 7.2
    config.root = __dir__
    # Not eager: eager loading reads every zoneinfo file (TZInfo), ~24k GVL releases that only lengthen the boot.
    config.eager_load = false
    config.enable_reloading = false
    config.consider_all_requests_local = false
    config.secret_key_base = "e2e" * 22
    config.hosts.clear
    config.logger = ActiveSupport::Logger.new(IO::NULL)
    config.log_level = :warn
  end
end

Rails.application.initialize!

# Pure-Ruby CPU work with recognisable names: reconcile -> post_entries -> checksum.
module LedgerCruncher
  ROUNDS_PER_MS = Integer(ENV.fetch("LEDGER_ROUNDS_PER_MS", "12000"))

  def self.reconcile(ms)
    total = 0
    (ms * 10).times { |batch| total = post_entries(total, batch) }
    total
  end

  def self.post_entries(total, batch)
    (ROUNDS_PER_MS / 10).times { |i| total = checksum(total, batch, i) }
    total
  end

  def self.checksum(total, batch, i)
    (total * 31 + batch * 7 + i) % 1_000_003
  end
end

LEDGER_LOCK = Thread::Mutex.new

if ENV["RVGOLDEN_DIR"]
  $LOAD_PATH.unshift(ENV["RVGOLDEN_DIR"])
  require "rvgolden"
end

class Entry < ActiveRecord::Base
end

ActiveRecord::Schema.verbose = false
ActiveRecord::Schema.define do
  create_table :entries, force: true do |t|
    t.string :account, null: false
    t.integer :cents, null: false
    t.timestamps
  end
  add_index :entries, :account
end
Entry.insert_all(Array.new(300) { |i| { account: "acct-#{i % 12}", cents: i * 37 % 1000, created_at: Time.now,
                                        updated_at: Time.now } })

class LedgerController < ActionController::Base
  skip_forgery_protection

  def health
    render plain: "ok"
  end

  def cpu
    render plain: LedgerCruncher.reconcile(20).to_s
  end

  def db
    account = "acct-#{rand(12)}"
    total = Entry.where(account: account).sum(:cents)
    recent = Entry.where(account: account).order(id: :desc).limit(10).pluck(:cents)
    Entry.create!(account: account, cents: recent.sum % 1000)
    render plain: "#{total} #{recent.size} #{Entry.count}"
  end

  def nap
    sleep(Integer(params.fetch(:ms, "20")) / 1000.0)
    render plain: "rested"
  end

  def locked
    v = LEDGER_LOCK.synchronize { LedgerCruncher.reconcile(Integer(params.fetch(:ms, "3"))) }
    render plain: v.to_s
  end

  def hold
    LEDGER_LOCK.synchronize { sleep(Integer(params.fetch(:ms, "1000")) / 1000.0) }
    render plain: "held"
  end

  def golden
    sleep(Integer(params.fetch(:ms, "300")) / 1000.0)
    out = ENV.fetch("RVGOLDEN_OUT")
    t0 = Process.clock_gettime(Process::CLOCK_MONOTONIC, :nanosecond)
    RvGolden.capture(out, false)
    t1 = Process.clock_gettime(Process::CLOCK_MONOTONIC, :nanosecond)
    File.write("#{out}.t", "#{t0} #{t1}\n")
    render plain: "captured"
  end
end

Rails.application.routes.draw do
  get "/health" => "ledger#health"
  get "/cpu" => "ledger#cpu"
  get "/db" => "ledger#db"
  get "/nap" => "ledger#nap"
  get "/locked" => "ledger#locked"
  get "/hold" => "ledger#hold"
  get "/golden" => "ledger#golden"
end
