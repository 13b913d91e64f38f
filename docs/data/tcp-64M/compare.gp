set terminal pngcairo size 1200,480 font 'sans,10'
set output 'compare.png'
set multiplot layout 1,2 title 'busbw against size, median of 5 interleaved run(s)' font 'sans,12'
set logscale x 2
set logscale y 10
set format y '%g'
set grid xtics ytics lc rgb '#dddddd'
set xlabel 'size (bytes)'
set ylabel 'busbw (GB/s)'
set key outside below font 'sans,9' maxrows 3
set title 'allreduce, 2 ranks'
set xtics ('64M' 67108864) rotate by -45
set xrange [44739242.666666664:100663296.0]
plot 'plot-data/allreduce-n2-khor-tcp-auto.dat' using 1:2 with linespoints lw 2 pt 7 ps 0.8 dt 1 lc rgb '#1f77b4' title 'khor tcp/auto', 'plot-data/allreduce-n2-mpi-tcp.dat' using 1:2 with linespoints lw 2 pt 5 ps 0.8 dt 2 lc rgb '#d62728' title 'OpenMPI tcp'
set title 'allreduce, 4 ranks'
set xtics ('64M' 67108864) rotate by -45
set xrange [44739242.666666664:100663296.0]
plot 'plot-data/allreduce-n4-khor-tcp-auto.dat' using 1:2 with linespoints lw 2 pt 7 ps 0.8 dt 1 lc rgb '#1f77b4' title 'khor tcp/auto', 'plot-data/allreduce-n4-mpi-tcp.dat' using 1:2 with linespoints lw 2 pt 5 ps 0.8 dt 2 lc rgb '#d62728' title 'OpenMPI tcp'
unset multiplot
